# Sourced by run-all.sh and ci-smoke.sh: every fuzz target and its input size limit.
# shellcheck shell=bash
declare -A FUZZ_MAX_LEN=(
    [chunk_reader]=8192
    [manifest_reader]=4096
    [partition_map_reader]=4096
    [npz_reader]=16384
    [mtx_reader]=4096
    [metis_reader]=4096
    [edgelist_reader]=4096
    [sparse_validation]=4096
    [capi_driver]=2048
)
FUZZ_TARGETS=(chunk_reader manifest_reader partition_map_reader npz_reader mtx_reader metis_reader
    edgelist_reader sparse_validation capi_driver)
