//! The distributed pipeline in one process (ranks as threads): the directory it writes equals
//! the single-machine pipeline's given the same partition; failures on one rank fail all and
//! leave the output as it was.

use std::vec::Vec;

use chunk_format::dir::{chunk_file_name, ChunkDir, MANIFEST_FILE};
use dist_comm::LocalComm;

use super::*;
use crate::graph::generate;
use crate::prep::{self as single, PrepConfig};

/// Parts by node id in contiguous ranges: each rank's nodes get `v · K / N`.
struct ByRange {
    nodes: u64,
    rank: usize,
}

impl DistPartitioner for ByRange {
    fn tag(&self) -> String {
        "by-range".into()
    }

    fn partition(
        &mut self,
        graph: &DistAdjacency,
        _weights: Option<&[u64]>,
        parts: u32,
    ) -> Result<(Vec<u32>, u64), String> {
        let first = graph.vtxdist[self.rank];
        let rows = (graph.xadj.len() - 1) as u64;
        #[allow(clippy::cast_possible_truncation, reason = "v · K / N < K, a u32")]
        let parts_of = (first..first + rows)
            .map(|v| (v * u64::from(parts) / self.nodes) as u32)
            .collect();
        Ok((parts_of, 0))
    }
}

fn config(input: &std::path::Path, parts: u32, out: &std::path::Path) -> DistPrepConfig {
    DistPrepConfig {
        input: input.to_path_buf(),
        parts,
        out: out.to_path_buf(),
        normalization: Normalization::Gcn,
        balance: Balance::Nodes,
        force: false,
        command_line: Vec::new(),
    }
}

#[test]
fn the_ranks_write_the_single_machine_pipelines_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = generate::rmat(9, 4, 2).unwrap();
    generate::random_node_data(&mut g, 6, 3, 4).unwrap();
    let input = tmp.path().join("g.npz");
    npz::write_npz(&input, &g).unwrap();
    for (ranks, parts) in [(1, 1), (2, 2), (2, 3), (3, 5)] {
        let out = tmp.path().join(format!("d{ranks}-{parts}"));
        let reports = LocalComm::run(ranks, |comm| {
            let mut partitioner = ByRange {
                nodes: g.num_nodes as u64,
                rank: dist_comm::Group::rank(&comm),
            };
            run(&comm, &config(&input, parts, &out), &mut partitioner)
        });
        let mut with_manifest = 0;
        for report in reports {
            let report = report.unwrap();
            assert_eq!(report.phases.len(), 6);
            assert!(report.phases.iter().all(|p| p.peak_rss.len() == ranks));
            with_manifest += usize::from(report.manifest.is_some());
        }
        assert_eq!(with_manifest, 1, "rank 0 alone reports the manifest");
        // The single-machine pipeline with the saved map writes the same chunks.
        let again = tmp.path().join(format!("s{ranks}-{parts}"));
        let mut single_config = PrepConfig::new(&input, parts, &again);
        single_config.partition_map = Some(out.join("partition.map"));
        single::run(&single_config, &|_| {}).unwrap();
        let dir = ChunkDir::open(&out).unwrap();
        assert_eq!(dir.parts(), parts);
        for p in 0..parts {
            let name = chunk_file_name(p);
            assert!(
                std::fs::read(out.join(&name)).unwrap()
                    == std::fs::read(again.join(&name)).unwrap(),
                "{name} differs at {ranks} ranks"
            );
        }
        assert_eq!(
            dir.manifest().nnz,
            ChunkDir::open(&again).unwrap().manifest().nnz
        );
    }
}

#[test]
fn a_failure_on_one_rank_fails_all_and_leaves_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let g = generate::rmat(7, 4, 2).unwrap();
    let input = tmp.path().join("g.npz");
    npz::write_npz(&input, &g).unwrap();
    let out = tmp.path().join("out");
    // A first run, then one whose partitioner fails on rank 1.
    LocalComm::run(2, |comm| {
        run(
            &comm,
            &config(&input, 2, &out),
            &mut ByRange {
                nodes: g.num_nodes as u64,
                rank: dist_comm::Group::rank(&comm),
            },
        )
        .map(|_| ())
    })
    .into_iter()
    .for_each(|r| r.unwrap());
    let manifest = std::fs::read(out.join(MANIFEST_FILE)).unwrap();
    struct FailsOnRankOne(usize);
    impl DistPartitioner for FailsOnRankOne {
        fn tag(&self) -> String {
            "fails".into()
        }
        fn partition(
            &mut self,
            _: &DistAdjacency,
            _: Option<&[u64]>,
            _: u32,
        ) -> Result<(Vec<u32>, u64), String> {
            Err(std::format!("rank {} cannot", self.0))
        }
    }
    let results = LocalComm::run(2, |comm| {
        let mut p = FailsOnRankOne(dist_comm::Group::rank(&comm));
        let mut config = config(&input, 3, &out);
        config.force = true;
        run(&comm, &config, &mut p).map(|_| ())
    });
    for result in results {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("rank 0 cannot") || err.contains("the partitioner failed"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(out.join(MANIFEST_FILE)).unwrap(), manifest);
    assert_eq!(ChunkDir::open(&out).unwrap().parts(), 2);
    // Fewer parts than ranks, and an input that is not .npz, are refused on every rank.
    for (parts, input) in [(1, input.clone()), (2, tmp.path().join("g.mtx"))] {
        let results = LocalComm::run(2, |comm| {
            run(
                &comm,
                &config(&input, parts, &out),
                &mut ByRange { nodes: 1, rank: 0 },
            )
            .map(|_| ())
        });
        assert!(results.iter().all(Result::is_err));
    }
}
