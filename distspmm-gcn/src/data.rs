//! Data-parallel training: rank p memory-maps chunk p, the aggregation runs through the
//! distributed SpMM, the dense-weight gradients are summed across ranks.

use super::model::{Aggregate, GcnConfig, LocalData, TRAIN};
use super::{
    agree, check_features, maybe_normalize_rows, train_loop, Config, Event, Job, Schedule, Summary,
};
use anyhow::{bail, Context, Result};
use chunk_format::ChunkView;
use distspmm_core::kernel;
use distspmm_core::schedule::ScheduleKind;
use distspmm_core::sparse::{CscOwned, CsrOwned, DenseView, DenseViewMut};
use distspmm_op::DistSpmm;

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

/// Â·X through the distributed SpMM: this rank's rows, communication per the schedule.
pub struct DistAggregate<'a, C: dist_comm::Communicator> {
    op: DistSpmm<'a, C>,
}

impl<C: dist_comm::Communicator> std::fmt::Debug for DistAggregate<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistAggregate")
            .field("schedule", &self.op.schedule())
            .field("rows", &self.op.local_rows())
            .finish()
    }
}

/// Builds the distributed SpMM of this rank's chunk (collective).
pub fn dist_aggregate<'a, C: dist_comm::Communicator>(
    comm: &'a C,
    chunk: ChunkView<'a>,
    schedule: Schedule,
) -> Result<DistAggregate<'a, C>> {
    let kind = match schedule {
        Schedule::Halo => ScheduleKind::Halo,
        Schedule::Broadcast => ScheduleKind::Broadcast,
    };
    let op = DistSpmm::new(comm, chunk, kind).context("cannot set up the distributed SpMM")?;
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
    fn bytes_received(&self) -> u64 {
        let t = self.op.bytes_total();
        t.forward.received + t.backward.received
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
        .find(|(_, &y)| y >= classes as i32)
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
    let opened = (|| -> Result<_> {
        let dir = distspmm_core::chunk::ChunkDir::open(dir_path)?;
        let parts = dir.parts() as usize;
        if parts != ranks {
            bail!(
                "{} holds {parts} parts but {ranks} ranks were started: launch `mpirun -n {parts}` or re-partition with `distspmm partition --parts {ranks}`",
                dir_path.display()
            );
        }
        let chunk = dir.load(rank as u32)?;
        Ok((dir, chunk))
    })();
    let (dir, chunk) = agree(comm, opened)?;
    let chunk_path = dir.chunk_path(rank as u32)?;
    let view = chunk.view();
    let mut nd = agree(comm, node_data(args, view, &chunk_path))?;
    if args.normalize_features {
        maybe_normalize_rows(comm, &mut nd.features, nd.in_dim, on)?;
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
    let mut agg = dist_aggregate(comm, *view, args.schedule)?;
    let data = LocalData {
        features: &nd.features,
        labels: &nd.labels,
        masks: &nd.masks,
        original_ids: &nd.ids,
    };
    let job = Job {
        args,
        cfg,
        mode: "data",
        data_id: dir.manifest().fingerprint.clone(),
        rank,
        ranks,
    };
    train_loop(&job, comm, model, &mut agg, &data, on)
}
