//! Cora end to end through the library (`prep::run`: load, GCN-normalise, METIS at P = 2, 4,
//! 8, write the chunk directory), and check that reassembling the chunks gives Â exactly and
//! that features, labels and masks follow their nodes.

use std::path::{Path, PathBuf};

use chunk_format::dir::ChunkDir;

use distspmm_prep::chunk::VerifyDir;
use distspmm_prep::graph::load;
use distspmm_prep::normalize::{adjacency, Normalization};
use distspmm_prep::partition::{Adjacency, Method, MetisOptions};
use distspmm_prep::prep::{self, PrepConfig};

/// `../shared/datasets/cora.npz` from the repository root, or `None` (skip) when it is absent
/// outside CI.
fn cora() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/datasets/cora.npz");
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing (required when CI=true)",
        path.display()
    );
    eprintln!("skipping: {} not found", path.display());
    None
}

#[test]
fn cora_chunks_reassemble_to_a_hat_and_carry_node_data() {
    let Some(path) = cora() else { return };
    let g = load(&path).unwrap();
    let a_hat = adjacency(
        g.num_nodes,
        &g.src,
        &g.dst,
        g.weights.as_deref(),
        Normalization::Gcn,
    )
    .unwrap();
    let adj = Adjacency::from_edges(g.num_nodes, &g.src, &g.dst).unwrap();
    let features = g.features.as_ref().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for parts in [2u32, 4, 8] {
        let dir = tmp.path().join(format!("p{parts}"));
        let config = PrepConfig {
            method: Method::Metis(MetisOptions::default()),
            ..PrepConfig::new(&path, parts, &dir)
        };
        let report = prep::run(&config, &|_| {}).unwrap();
        let opened = ChunkDir::open(&dir).unwrap();
        let part = opened.load_partition().unwrap();
        assert!(
            part.imbalance() <= 1.05,
            "P={parts}: imbalance {}",
            part.imbalance()
        );
        assert_eq!(report.manifest.edge_cut, part.edge_cut(&adj).unwrap());

        let chunks = opened.validate_all().unwrap();
        let back = opened.reassemble().unwrap();

        // Â in renumbered ids, entry by entry (bit-identical values).
        let r = part.renumbering();
        assert_eq!(back.nnz(), a_hat.nnz());
        for v in 0..g.num_nodes {
            let (cols, vals) = a_hat.row(v);
            let mut want: Vec<(u32, u32)> = cols
                .iter()
                .zip(vals)
                .map(|(&u, &x)| (r.old_to_new()[u as usize], x.to_bits()))
                .collect();
            want.sort_unstable();
            let (bc, bv) = back.row(r.old_to_new()[v] as usize);
            let got: Vec<(u32, u32)> = bc.iter().zip(bv).map(|(&c, &x)| (c, x.to_bits())).collect();
            assert_eq!(got, want, "P={parts}, row of node {v}");
        }

        // Node data follows the renumbering.
        for chunk in &chunks {
            let view = chunk.view();
            let f = view.features().unwrap();
            for (i, &orig) in view.original_ids().iter().enumerate() {
                let v = usize::try_from(orig).unwrap();
                assert_eq!(&f[i * 1433..(i + 1) * 1433], features.row(v));
                assert_eq!(view.labels().unwrap()[i], g.labels.as_ref().unwrap()[v]);
                let m = view.masks().unwrap()[i];
                assert_eq!(m & 1 != 0, g.train_mask.as_ref().unwrap()[v]);
                assert_eq!(m & 2 != 0, g.val_mask.as_ref().unwrap()[v]);
                assert_eq!(m & 4 != 0, g.test_mask.as_ref().unwrap()[v]);
            }
        }
    }
}
