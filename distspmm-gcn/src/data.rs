//! Data-parallel training: rank p memory-maps chunk p, the aggregation runs through the
//! distributed SpMM, the dense-weight gradients are summed across ranks.

use super::model::{zeros, Aggregate, LocalData};
use super::nn::{EdgeWeights, Graph};
use super::{
    agree, check_features, finish, maybe_normalize_rows, Config, Event, Job, Outcome, Placement,
    Schedule, Task,
};
use anyhow::{bail, Context, Result};
use chunk_format::ChunkView;
use dist_comm::Counting;
use distspmm_op::schedule::ScheduleKind;
use distspmm_op::{ChunkSource, DistSpmm, Precision, RankChunk};
use distspmm_sparse::sparse::{DenseView, DenseViewMut};

/// Â·X through the distributed SpMM: this rank's rows, communication per the schedule, over a
/// [`Counting`] layer that measures what the schedule hands the transport.
pub struct DistAggregate<'a, C: dist_comm::Communicator, K: ChunkSource = &'a RankChunk> {
    op: DistSpmm<Box<Counting<'a, C>>, K>,
    edges: EdgeData,
}

/// What the per-edge layers read of the chunk, computed on first use and kept.
#[derive(Debug, Default)]
struct EdgeData {
    /// The graph's own weights of the per-edge operand's positions.
    raw: Option<Vec<f32>>,
    sum: Option<Vec<f32>>,
    mean: Option<Vec<f32>>,
    ends: Option<Vec<(u64, u64)>>,
}

impl<C: dist_comm::Communicator, K: ChunkSource> std::fmt::Debug for DistAggregate<'_, C, K> {
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
    (schedule, precision): (Schedule, Precision),
    dir: &std::path::Path,
) -> Result<DistAggregate<'a, C>> {
    let kind = match schedule {
        Schedule::Halo => ScheduleKind::Halo,
        Schedule::Broadcast => ScheduleKind::Broadcast,
    };
    let op = DistSpmm::with_precision(Box::new(Counting::new(comm)), chunk, kind, precision)
        .with_context(|| {
            format!(
                "cannot set up the distributed SpMM over the chunks in {}",
                dir.display()
            )
        })?;
    Ok(DistAggregate {
        op,
        edges: EdgeData::default(),
    })
}

/// A whole graph held by one process as the operator over its one-part `chunk` (tensor-parallel
/// training: every rank holds every row; `solo` is a communicator of this process alone).
pub fn whole_graph<K: ChunkSource>(
    solo: &dist_comm::LocalComm,
    chunk: K,
) -> Result<DistAggregate<'_, dist_comm::LocalComm, K>> {
    let op = DistSpmm::new(Box::new(Counting::new(solo)), chunk, ScheduleKind::Halo)
        .context("cannot set up the whole graph's SpMM")?;
    Ok(DistAggregate {
        op,
        edges: EdgeData::default(),
    })
}

impl<C: dist_comm::Communicator, K: ChunkSource> Aggregate for DistAggregate<'_, C, K> {
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
    fn bytes_by_direction(&self) -> [u64; 2] {
        let t = self.op.bytes_total();
        [t.forward.received, t.backward.received]
    }
    fn bytes_received(&self) -> u64 {
        self.op.comm().counts().schedule().received
    }
}

impl<C: dist_comm::Communicator, K: ChunkSource> DistAggregate<'_, C, K> {
    /// The graph's own edge weights in the per-edge layout (read from the chunk once).
    fn raw_weights(&mut self) -> Result<&[f32]> {
        if self.edges.raw.is_none() {
            let what = "the graph's edge weights";
            let mut raw = zeros(self.op.edge_count(), what)?;
            self.op.edge_weights(&mut raw)?;
            self.edges.raw = Some(raw);
        }
        Ok(self.edges.raw.as_deref().unwrap_or_default())
    }
}

/// Each position's destination row, in layout order.
fn edge_rows<'o, C: dist_comm::Communicator, K: ChunkSource>(
    op: &'o DistSpmm<Box<Counting<'_, C>>, K>,
) -> impl Iterator<Item = usize> + 'o {
    op.edges().map(|(row, _)| row)
}

/// Bits of an original id per f32 piece: exact in an f32's 24-bit significand.
const ID_PIECE_BITS: u32 = 22;

impl<C: dist_comm::Communicator, K: ChunkSource> Graph for DistAggregate<'_, C, K> {
    fn rows(&self) -> usize {
        self.op.local_rows()
    }

    fn edge_count(&self) -> usize {
        self.op.edge_count()
    }

    fn edge_weights(&mut self, kind: EdgeWeights) -> Result<&[f32]> {
        let ready = match kind {
            EdgeWeights::Sum => self.edges.sum.is_some(),
            EdgeWeights::Mean => self.edges.mean.is_some(),
        };
        if !ready {
            let raw = self.raw_weights()?.to_vec();
            let values = match kind {
                EdgeWeights::Sum => raw,
                EdgeWeights::Mean => {
                    // Row sums in f64, in layout order (the same order on every run).
                    let mut sums = vec![0.0f64; self.op.local_rows()];
                    for (row, &w) in edge_rows(&self.op).zip(&raw) {
                        sums[row] += f64::from(w);
                    }
                    edge_rows(&self.op)
                        .zip(&raw)
                        .map(|(row, &w)| {
                            #[allow(
                                clippy::cast_possible_truncation,
                                reason = "deliberate: the mean weight rounded to f32"
                            )]
                            let v = if sums[row] > 0.0 {
                                (f64::from(w) / sums[row]) as f32
                            } else {
                                0.0
                            };
                            v
                        })
                        .collect()
                }
            };
            match kind {
                EdgeWeights::Sum => self.edges.sum = Some(values),
                EdgeWeights::Mean => self.edges.mean = Some(values),
            }
        }
        Ok(match kind {
            EdgeWeights::Sum => self.edges.sum.as_deref(),
            EdgeWeights::Mean => self.edges.mean.as_deref(),
        }
        .unwrap_or_default())
    }

    fn edge_ends(&mut self) -> Result<&[(u64, u64)]> {
        if self.edges.ends.is_none() {
            let n = self.op.local_rows();
            let ids = self.op.chunk().original_ids().to_vec();
            // The sources' original ids come from their owners through the SDDMM's exchange:
            // `e = 1 · piece_j` per edge, one exact f32 piece of the id at a time.
            let ones = vec![1.0f32; n];
            let mut sources = vec![0u64; self.op.edge_count()];
            let mut e = vec![0.0f32; self.op.edge_count()];
            let mask = (1u64 << ID_PIECE_BITS) - 1;
            for piece in 0..3 {
                let shift = piece * ID_PIECE_BITS;
                #[allow(clippy::cast_precision_loss, reason = "a 22-bit piece is exact in f32")]
                let v: Vec<f32> = ids
                    .iter()
                    .map(|&id| ((id >> shift) & mask) as f32)
                    .collect();
                self.op.sddmm(
                    DenseView::from_row_major(&ones, n, 1)?,
                    DenseView::from_row_major(&v, n, 1)?,
                    &mut e,
                )?;
                for (s, &x) in sources.iter_mut().zip(&e) {
                    #[allow(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        reason = "an exact non-negative integer below 2^22"
                    )]
                    let bits = x as u64;
                    *s |= bits << shift;
                }
            }
            let ends = edge_rows(&self.op)
                .zip(sources)
                .map(|(row, src)| (ids[row], src))
                .collect();
            self.edges.ends = Some(ends);
        }
        Ok(self.edges.ends.as_deref().unwrap_or_default())
    }

    fn spmm_edges_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        x: DenseView<'_, f32>,
        y: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        Ok(self.op.spmm_values_grouped(groups, e, x, y)?)
    }

    fn spmm_edges_transpose_grouped(
        &mut self,
        groups: usize,
        e: &[f32],
        dy: DenseView<'_, f32>,
        dx: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        Ok(self.op.spmm_values_transpose_grouped(groups, e, dy, dx)?)
    }

    fn sddmm_grouped(
        &mut self,
        groups: usize,
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        e: &mut [f32],
    ) -> Result<()> {
        Ok(self.op.sddmm_grouped(groups, u, v, e)?)
    }

    fn sddmm_backward_grouped(
        &mut self,
        groups: usize,
        de: &[f32],
        u: DenseView<'_, f32>,
        v: DenseView<'_, f32>,
        du: DenseViewMut<'_, f32>,
        dv: DenseViewMut<'_, f32>,
    ) -> Result<()> {
        Ok(self.op.sddmm_backward_grouped(groups, de, u, v, du, dv)?)
    }

    fn edge_softmax_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        Ok(self.op.edge_softmax_grouped(groups, slope, logits, out)?)
    }

    fn edge_softmax_backward_grouped(
        &mut self,
        groups: usize,
        slope: Option<f32>,
        logits: &[f32],
        out: &[f32],
        d: &mut [f32],
    ) -> Result<()> {
        Ok(self
            .op
            .edge_softmax_backward_grouped(groups, slope, logits, out, d)?)
    }
}

/// This rank's node data, copied out of the chunk.
struct NodeData {
    features: Vec<f32>,
    /// Empty with multi-label `targets`.
    labels: Vec<i32>,
    targets: Option<Vec<u8>>,
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
    let targets = view.targets().map(<[u8]>::to_vec);
    let labels = match (view.labels(), &targets) {
        (Some(labels), _) => labels,
        (None, Some(_)) => &[],
        (None, None) => bail!(
            "{} carries no labels; partition a graph with labels (`y`) to train a GCN",
            path.display()
        ),
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
        targets,
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
fn content_fingerprint(m: &chunk_format::dir::Manifest) -> String {
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
    chunk_format::dir::fingerprint_hex(&h.digest128().to_le_bytes())
}

/// What a chunk directory's data is: the input graph's content and Â's normalisation where the
/// manifest records the graph's fingerprint (the same for every partition of the graph), the
/// chunks' own content otherwise.
fn data_identity(m: &chunk_format::dir::Manifest) -> super::checkpoint::DataIdentity {
    match &m.graph_fingerprint {
        Some(fingerprint) => super::checkpoint::DataIdentity::Graph {
            fingerprint: fingerprint.clone(),
            normalization: m.normalization.clone(),
        },
        None => super::checkpoint::DataIdentity::Chunks {
            fingerprint: content_fingerprint(m),
        },
    }
}

/// Sets up data-parallel work on this rank and runs `task` (collective).
pub(crate) fn run<C>(
    args: &Config,
    dir_path: &std::path::Path,
    comm: &C,
    on: &mut dyn FnMut(Event),
    task: Task<'_>,
) -> Result<Outcome>
where
    C: dist_comm::Communicator,
{
    let (rank, ranks) = (comm.rank(), comm.size());
    let opened = distspmm_op::open_rank_chunk(dir_path, rank, ranks);
    let (dir, chunk) = agree(comm, opened.map_err(anyhow::Error::from))?;
    // Before any other collective: the operator's agreement checks that every rank holds the
    // same partition and the same content (a stale copy of the chunks on one host).
    let mut agg = dist_aggregate(comm, &chunk, (args.schedule, args.comm_precision), dir_path)?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "rank < ranks, which open_rank_chunk checked to equal the chunks' u32 part count"
    )]
    let part = rank as u32;
    let chunk_path = dir.chunk_path(part)?;
    let view = chunk.view();
    let mut nd = agree(comm, node_data(args, view, &chunk_path))?;
    // The class count sizes the output layer: it must be what the labels justify (partition
    // writes the largest label + 1), not just any number a chunk header declares. Multi-label
    // targets have a column per class; every rank must hold the same kind.
    let multi = f64::from(u8::from(nd.targets.is_some()));
    let mut top = [
        nd.labels.iter().copied().max().map_or(-1.0, f64::from),
        multi,
        -multi,
    ];
    comm.all_reduce(&mut top, dist_comm::ReduceOp::Max)
        .context("cannot agree on the largest label")?;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "an i32 label + 1, at most 2^31: exact"
    )]
    let justified = (top[0] + 1.0).max(0.0) as usize;
    let multi_label = nd.targets.is_some();
    let classes_ok = if top[1] != -top[2] {
        Err(anyhow::anyhow!(
            "some chunks of {} hold multi-label targets and others class labels: re-run `distspmm partition` on the graph",
            dir_path.display()
        ))
    } else if !multi_label && nd.classes > justified {
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
    let metric = agree(
        comm,
        super::model::Metric::resolve(args.metric, multi_label),
    )?;
    let cfg = args.model_config(nd.in_dim, nd.classes, multi_label);
    let data = LocalData {
        features: &nd.features,
        labels: &nd.labels,
        targets: nd.targets.as_deref(),
        masks: &nd.masks,
        original_ids: &nd.ids,
    };
    let mut train_total = [super::nn::net::local_train_count(&data, nd.classes)];
    comm.all_reduce_sum(&mut train_total)?;
    let model = agree(
        comm,
        super::nn::net::Net::new(
            cfg.clone(),
            view.num_local_nodes(),
            agg.edge_count(),
            train_total[0],
        ),
    )?;
    let partition = super::checkpoint::PartitionIdentity {
        parts: dir.parts(),
        fingerprint: dir.manifest().fingerprint.clone(),
    };
    let job = Job::new(
        args,
        cfg,
        metric,
        "data",
        data_identity(dir.manifest()),
        Some(partition),
        dir_path,
        comm,
    );
    let placement = Placement {
        nodes: dir.manifest().nodes,
        rows: 0..view.num_local_nodes(),
    };
    finish(&job, comm, model, &mut agg, &data, &placement, on, task)
}
