//! Data-parallel training: rank p memory-maps chunk p, the aggregation runs through the
//! distributed SpMM, the dense-weight gradients are summed across ranks.

use super::model::{Aggregate, GcnConfig, LocalData, TRAIN};
use super::{
    agree, check_features, maybe_normalize_rows, train_loop, Config, Event, Job, Schedule, Summary,
};
use anyhow::{bail, Context, Result};
use chunk_format::ChunkView;
use dist_comm::Counting;
use distspmm_core::kernel;
use distspmm_core::schedule::ScheduleKind;
use distspmm_core::sparse::{CscOwned, CsrOwned, DenseView, DenseViewMut};
use distspmm_op::{DistSpmm, RankChunk};

/// Â·X over all rows in one process (tensor mode, where every rank holds the whole graph).
#[derive(Debug)]
pub struct LocalAggregate {
    a: CsrOwned<f32>,
    a_csc: CscOwned<f32>,
}

impl LocalAggregate {
    /// From Â and its CSC form.
    pub fn new(a: CsrOwned<f32>, a_csc: CscOwned<f32>) -> Self {
        Self { a, a_csc }
    }
}

impl Aggregate for LocalAggregate {
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
        let n = self.a.nrows();
        let x = DenseView::from_row_major(&x[..n * f], n, f)?;
        let y = DenseViewMut::from_row_major(&mut y[..n * f], n, f)?;
        kernel::spmm(1.0, &self.a.view(), x, 0.0, y)?;
        Ok(())
    }
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
        let n = self.a.nrows();
        let x = DenseView::from_row_major(&dy[..n * f], n, f)?;
        let y = DenseViewMut::from_row_major(&mut dx[..n * f], n, f)?;
        kernel::spmm_transpose(1.0, &self.a_csc.view(), x, 0.0, y)?;
        Ok(())
    }
    fn bytes_received(&self) -> u64 {
        0
    }
}

/// Â·X through the distributed SpMM: this rank's rows, communication per the schedule, over a
/// [`Counting`] layer that measures what the schedule hands the transport.
pub struct DistAggregate<'a, C: dist_comm::Communicator> {
    op: DistSpmm<Box<Counting<'a, C>>, &'a RankChunk>,
}

impl<C: dist_comm::Communicator> std::fmt::Debug for DistAggregate<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistAggregate")
            .field("schedule", &self.op.schedule())
            .field("rows", &self.op.local_rows())
            .finish()
    }
}

/// Builds the distributed SpMM of this rank's chunk from the chunk directory `dir`
/// (collective): its agreement is where the ranks find out whether they all hold one
/// directory's content.
pub fn dist_aggregate<'a, C: dist_comm::Communicator>(
    comm: &'a C,
    chunk: &'a RankChunk,
    schedule: Schedule,
    dir: &std::path::Path,
) -> Result<DistAggregate<'a, C>> {
    let kind = match schedule {
        Schedule::Halo => ScheduleKind::Halo,
        Schedule::Broadcast => ScheduleKind::Broadcast,
    };
    let op = DistSpmm::new(Box::new(Counting::new(comm)), chunk, kind).with_context(|| {
        format!(
            "cannot set up the distributed SpMM over the chunks in {}",
            dir.display()
        )
    })?;
    Ok(DistAggregate { op })
}

impl<C: dist_comm::Communicator> Aggregate for DistAggregate<'_, C> {
    fn forward(&mut self, x: &[f32], f: usize, y: &mut [f32]) -> Result<()> {
        let n = self.op.local_rows();
        let x = DenseView::from_row_major(&x[..n * f], n, f)?;
        let y = DenseViewMut::from_row_major(&mut y[..n * f], n, f)?;
        self.op.forward(x, y)?;
        Ok(())
    }
    fn backward(&mut self, dy: &[f32], f: usize, dx: &mut [f32]) -> Result<()> {
        let n = self.op.local_rows();
        let x = DenseView::from_row_major(&dy[..n * f], n, f)?;
        let y = DenseViewMut::from_row_major(&mut dx[..n * f], n, f)?;
        self.op.backward(x, y)?;
        Ok(())
    }
    /// The exchanges' bytes as counted at the transport (point-to-point and broadcast; the
    /// operator's own agreement reductions are not part of them).
    fn bytes_received(&self) -> u64 {
        self.op.comm().counts().schedule().received
    }
}

/// This rank's node data, copied out of the chunk.
struct NodeData {
    features: Vec<f32>,
    labels: Vec<i32>,
    masks: Vec<u8>,
    ids: Vec<u64>,
    in_dim: usize,
    classes: usize,
}

fn node_data(args: &Config, view: &ChunkView<'_>, path: &std::path::Path) -> Result<NodeData> {
    let h = view.header();
    let n = view.num_local_nodes();
    let in_dim = h.feature_dim as usize;
    let classes = h.num_classes as usize;
    let Some(features) = view.features() else {
        bail!(
            "{} carries no features; partition a graph with node features (`x`) to train a GCN",
            path.display()
        )
    };
    let Some(labels) = view.labels() else {
        bail!(
            "{} carries no labels; partition a graph with labels (`y`) to train a GCN",
            path.display()
        )
    };
    let masks = view.masks().map_or_else(|| vec![0u8; n], <[u8]>::to_vec);
    let ids = view.original_ids().to_vec();
    if let Some((r, &y)) = labels
        .iter()
        .enumerate()
        .find(|(_, &y)| usize::try_from(y).is_ok_and(|y| y >= classes))
    {
        bail!(
            "{}: node {} has label {y} but the chunk declares {classes} classes",
            path.display(),
            ids[r]
        );
    }
    let mut features = features.to_vec();
    check_features(&mut features, in_dim, |r| ids[r], args.on_nonfinite)
        .with_context(|| format!("in {}", path.display()))?;
    Ok(NodeData {
        features,
        labels: labels.to_vec(),
        masks,
        ids,
        in_dim,
        classes,
    })
}

/// Identity of a chunk directory's contents: xxh3-128 over its partition fingerprint,
/// normalisation, partition map checksum and every chunk's length and checksum. Loading a chunk
/// checks its own checksum against the manifest's, so equal fingerprints mean equal chunks
/// (features, labels, masks and Â), and a graph regenerated with the same partition differs.
fn content_fingerprint(m: &distspmm_core::chunk::Manifest) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"distspmm-chunks-v1\0");
    for text in [&m.fingerprint, &m.normalization, &m.partition_map.checksum] {
        h.update(&(text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    for c in &m.chunks {
        h.update(&c.bytes.to_le_bytes());
        h.update(&(c.checksum.len() as u64).to_le_bytes());
        h.update(c.checksum.as_bytes());
    }
    distspmm_core::chunk::fingerprint_hex(&h.digest128().to_le_bytes())
}

/// Runs data-parallel training on this rank.
pub fn run<C>(
    args: &Config,
    dir_path: &std::path::Path,
    comm: &C,
    on: &mut dyn FnMut(Event),
) -> Result<Summary>
where
    C: dist_comm::Communicator,
{
    let (rank, ranks) = (comm.rank(), comm.size());
    let opened = distspmm_op::open_rank_chunk(dir_path, rank, ranks);
    let (dir, chunk) = agree(comm, opened.map_err(anyhow::Error::from))?;
    // Before any other collective: the operator's agreement checks that every rank holds the
    // same partition and the same content (a stale copy of the chunks on one host).
    let mut agg = dist_aggregate(comm, &chunk, args.schedule, dir_path)?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "rank < ranks, which open_rank_chunk checked to equal the chunks' u32 part count"
    )]
    let part = rank as u32;
    let chunk_path = dir.chunk_path(part)?;
    let view = chunk.view();
    let mut nd = agree(comm, node_data(args, view, &chunk_path))?;
    // The class count sizes the output layer: it must be what the labels justify (partition
    // writes the largest label + 1), not just any number a chunk header declares.
    let mut top = [nd.labels.iter().copied().max().map_or(-1.0, f64::from)];
    comm.all_reduce(&mut top, dist_comm::ReduceOp::Max)
        .context("cannot agree on the largest label")?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an i32 label + 1, at most 2^31: exact"
    )]
    let justified = (top[0] + 1.0).max(0.0) as usize;
    let classes_ok = if nd.classes > justified {
        Err(anyhow::anyhow!(
            "{} declares {} classes, but the largest label in the chunks is {}: re-run `distspmm partition` on the graph",
            dir_path.display(),
            nd.classes,
            top[0]
        ))
    } else {
        Ok(())
    };
    agree(comm, classes_ok)?;
    if args.normalize_features {
        let ids = &nd.ids;
        maybe_normalize_rows(comm, &mut nd.features, nd.in_dim, |r| ids[r], on)?;
    }
    let cfg = GcnConfig {
        in_dim: nd.in_dim,
        hidden: args.hidden,
        classes: nd.classes,
        layers: args.layers,
        dropout: args.dropout,
        lr: args.lr,
        weight_decay: args.weight_decay,
        seed: args.seed,
    };
    let mut train_total = [nd
        .masks
        .iter()
        .zip(&nd.labels)
        .filter(|(&m, &y)| m & TRAIN != 0 && y >= 0)
        .count() as u64];
    comm.all_reduce_sum(&mut train_total)?;
    let model = agree(
        comm,
        super::model::Gcn::new(cfg.clone(), view.num_local_nodes(), train_total[0]),
    )?;
    let data = LocalData {
        features: &nd.features,
        labels: &nd.labels,
        masks: &nd.masks,
        original_ids: &nd.ids,
    };
    let partition = super::checkpoint::PartitionIdentity {
        parts: dir.parts(),
        fingerprint: dir.manifest().fingerprint.clone(),
    };
    let job = Job::new(
        args,
        cfg,
        "data",
        content_fingerprint(dir.manifest()),
        Some(partition),
        dir_path,
        comm,
    );
    train_loop(&job, comm, model, &mut agg, &data, on)
}
