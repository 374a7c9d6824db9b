//! The partition pipeline's ends, at `DISTSPMM_BENCH_SCALE=k`:
//! - `chunk_reader_rmat{14+k}_p2`: opening the two chunks of a METIS partition of RMAT of scale
//!   14 + k, as a rank does. `map_validate`: `ChunkDir::load` of every part of a directory
//!   `write_chunk_dir` wrote (memory map, full validation with the checksums, the checks against
//!   the manifest; the files in the page cache after the first call); `parse`: the validation
//!   alone, `ChunkView::parse` over the chunks' bytes in memory. Throughput in the chunks'
//!   bytes, so criterion reports GB/s.
//! - `partition_rmat{12+k}`: one METIS k-way run (`distspmm partition --method metis`'s
//!   defaults: seed 1, ufactor 30, edge cut) into 4 parts. Throughput in adjacency entries
//!   (both directions of each edge), so "elem/s" reads as entries per second.
//!
//! `cargo criterion -p distspmm-benches --bench pipeline`.

use std::time::Duration;

use chunk_format::dir::{ChunkDir, WriteOptions};
use chunk_format::ChunkView;
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use distspmm_benches::{
    chunk_builder, describe, encode_parts, gcn_matrix_with_weights, metis_partition, rmat_graph,
    scale, PARTITION_RMAT_SCALE, RMAT_SCALE,
};
use distspmm_prep::chunk::write_chunk_dir;
use distspmm_prep::partition::{self, Adjacency, Method, MetisOptions};

const READER_PARTS: u32 = 2;
const PARTITION_PARTS: u32 = 4;

fn chunk_reader(c: &mut Criterion, k: u32) {
    let scale = RMAT_SCALE + k;
    let g = rmat_graph(scale);
    let (a_hat, weights) = gcn_matrix_with_weights(&g);
    let name = format!("rmat{scale}");
    describe(&name, &a_hat);
    let partition = metis_partition(&g, READER_PARTS);
    let tmp = tempfile::tempdir().expect("a temporary directory for the chunks");
    let dir_path = tmp.path().join("chunks");
    let builder = chunk_builder(&g, &a_hat, &weights, &partition);
    write_chunk_dir(&dir_path, &builder, &WriteOptions::default()).expect("the chunks are written");
    let dir = ChunkDir::open(&dir_path).expect("the directory just written opens");
    let chunks = encode_parts(&builder);
    let bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    eprintln!("{name} in {READER_PARTS} chunks: {bytes} bytes");

    let mut group = c.benchmark_group(format!("chunk_reader_{name}_p{READER_PARTS}"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Bytes(bytes));
    group.bench_function("map_validate", |b| {
        b.iter(|| {
            for p in 0..READER_PARTS {
                let mapped = dir.load(p).expect("a chunk just written loads");
                std::hint::black_box(mapped.view().header().nnz);
            }
        })
    });
    group.bench_function("parse", |b| {
        b.iter(|| {
            for chunk in &chunks {
                let view = ChunkView::parse(chunk.as_bytes()).expect("an encoded chunk parses");
                std::hint::black_box(view.header().nnz);
            }
        })
    });
    group.finish();
}

fn partitioner(c: &mut Criterion, k: u32) {
    let scale = PARTITION_RMAT_SCALE + k;
    let g = rmat_graph(scale);
    let adjacency = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).expect("a valid graph");
    let entries = adjacency.adjncy().len() as u64;
    eprintln!(
        "rmat{scale}: {} nodes, {entries} adjacency entries",
        adjacency.num_nodes()
    );
    let mut group = c.benchmark_group(format!("partition_rmat{scale}"));
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(entries));
    let method = Method::Metis(MetisOptions::default());
    group.bench_function(BenchmarkId::new("metis_kway", PARTITION_PARTS), |b| {
        b.iter(|| {
            partition::partition(&adjacency, PARTITION_PARTS, &method)
                .expect("METIS partitions the benchmark graph")
        })
    });
    group.finish();
}

fn pipeline_benches(c: &mut Criterion) {
    let k = scale();
    chunk_reader(c, k);
    partitioner(c, k);
}

criterion_group!(benches, pipeline_benches);
criterion_main!(benches);
