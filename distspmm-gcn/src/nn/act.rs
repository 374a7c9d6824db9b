//! The element-wise steps around a layer: its output activation and its input dropout, forward
//! and backward, each written once for every layer.

use std::ops::Range;

use crate::dropout::DropoutKey;
use crate::par;
use rayon::prelude::*;

/// A layer's output activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Act {
    /// None (the last layer's logits).
    Identity,
    /// `max(z, 0)`.
    Relu,
    /// `z > 0 ? z : exp(z) − 1` (α = 1, GAT between layers).
    Elu,
}

impl Act {
    /// `out = act(z)`, element-wise (same lengths), in parallel on the current rayon pool.
    pub fn forward(self, z: &[f32], out: &mut [f32]) {
        let width = 4096;
        out.par_chunks_mut(width)
            .zip(z.par_chunks(width))
            .for_each(|(o, z)| self.apply(z, o));
    }

    /// `out = act(z)` on the calling thread (a row block's epilogue).
    pub fn apply(self, z: &[f32], out: &mut [f32]) {
        match self {
            Act::Identity => out.copy_from_slice(z),
            Act::Relu => out.iter_mut().zip(z).for_each(|(o, &z)| *o = z.max(0.0)),
            Act::Elu => out.iter_mut().zip(z).for_each(|(o, &z)| *o = elu(z)),
        }
    }

    /// `d ← d · act'(z)` in place, from the pre-activation `z` (same lengths). ReLU selects
    /// (`z > 0`), it does not multiply, so a NaN gradient at a dropped position stays dropped.
    pub fn backward(self, z: &[f32], d: &mut [f32]) {
        if self == Act::Identity {
            return;
        }
        let width = 4096;
        d.par_chunks_mut(width)
            .zip(z.par_chunks(width))
            .for_each(|(d, z)| match self {
                Act::Identity => {}
                Act::Relu => d
                    .iter_mut()
                    .zip(z)
                    .for_each(|(d, &z)| *d = if z > 0.0 { *d } else { 0.0 }),
                Act::Elu => d.iter_mut().zip(z).for_each(|(d, &z)| {
                    if z <= 0.0 {
                        *d *= z.exp();
                    }
                }),
            });
    }
}

/// The epilogue of a row block of a layer's sum: `z += c·side + b` on each row (`side` a
/// second branch of the sum scaled by `c`, or none), then `out = act(z)`, on the calling thread.
pub fn bias_act(z: &mut [f32], side: Option<(f32, &[f32])>, b: &[f32], act: Act, out: &mut [f32]) {
    let width = b.len();
    match side {
        Some((c, side)) => {
            for (zr, sr) in z.chunks_exact_mut(width).zip(side.chunks_exact(width)) {
                for ((z, &s), &bb) in zr.iter_mut().zip(sr).zip(b) {
                    *z += c * s + bb;
                }
            }
        }
        None => {
            for zr in z.chunks_exact_mut(width) {
                zr.iter_mut().zip(b).for_each(|(z, &bb)| *z += bb);
            }
        }
    }
    act.apply(z, out);
}

/// ELU with α = 1 (`exp_m1` keeps the small negative values exact).
/// [`bias_act`] over every row of `z` (`rows × b.len()`, `side` and `out` alike), blocks of rows
/// in parallel on the current rayon pool; each row is its own, so the cut changes no bit.
pub fn bias_act_rows(
    z: &mut [f32],
    side: Option<(f32, &[f32])>,
    b: &[f32],
    act: Act,
    out: &mut [f32],
) {
    let width = b.len();
    if width == 0 {
        return;
    }
    let block = par::task_rows(z.len() / width, width) * width;
    z.par_chunks_mut(block)
        .zip(out.par_chunks_mut(block))
        .enumerate()
        .for_each(|(i, (z, out))| {
            let side = side.map(|(c, s)| (c, &s[i * block..i * block + z.len()]));
            bias_act(z, side, b, act, out);
        });
}

fn elu(z: f32) -> f32 {
    if z > 0.0 {
        z
    } else {
        z.exp_m1()
    }
}

/// The input dropout of layer `layer`: its key for this pass (probability 0 in evaluation).
pub fn key(seed: u64, epoch: u64, layer: usize, p: f32, training: bool) -> DropoutKey {
    DropoutKey {
        seed,
        epoch,
        layer,
        p: if training { p } else { 0.0 },
    }
}

/// `dst = dropout(src)` over `ids.len()` rows of `width` (all columns).
pub fn dropout(key: &DropoutKey, ids: &[u64], src: &[f32], width: usize, dst: &mut [f32]) {
    key.apply(ids, src, width, 0..width, dst);
}

/// The gradient through [`dropout`] in place: dropout is linear, so it is the same masking and
/// scaling applied to the gradient (a dropped entry's gradient is 0, a kept one's is scaled).
/// Rows in parallel on the current rayon pool.
pub fn dropout_backward(key: &DropoutKey, ids: &[u64], d: &mut [f32], width: usize) {
    dropout_backward_cols(key, ids, d, 0..width);
}

/// [`dropout_backward`] of columns `cols` of a wider input: `d` holds those columns of every
/// row (`ids.len() × cols.len()`), keyed by their place in the whole row.
pub fn dropout_backward_cols(key: &DropoutKey, ids: &[u64], d: &mut [f32], cols: Range<usize>) {
    let width = cols.len();
    if key.p == 0.0 || width == 0 {
        return;
    }
    let rows = ids.len();
    let task = par::task_rows(rows, width);
    d[..rows * width]
        .par_chunks_mut(task * width)
        .zip(ids.par_chunks(task))
        .for_each(|(d, ids)| dropout_backward_rows(key, ids, d, cols.clone()));
}

/// [`dropout_backward`] of a block of rows (`ids.len() × cols.len()`, columns `cols` of the
/// whole row) on the calling thread.
pub fn dropout_backward_rows(key: &DropoutKey, ids: &[u64], d: &mut [f32], cols: Range<usize>) {
    let width = cols.len();
    if key.p == 0.0 || width == 0 {
        return;
    }
    let mut src = vec![0.0f32; width];
    for (row, &id) in d.chunks_exact_mut(width).zip(ids) {
        src.copy_from_slice(row);
        key.row(id).apply(cols.start, &src, row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elu_backward_matches_finite_differences() {
        let z = [-2.0f32, -0.5, -1e-3, 0.25, 3.0];
        let mut d = [1.0f32; 5];
        Act::Elu.backward(&z, &mut d);
        for (i, &zi) in z.iter().enumerate() {
            let h = 1e-3f32;
            let fd = (elu(zi + h) - elu(zi - h)) / (2.0 * h);
            assert!((fd - d[i]).abs() < 1e-2, "z {zi}: {fd} vs {}", d[i]);
        }
    }

    #[test]
    fn dropout_backward_is_the_forward_mask() {
        let key = key(7, 3, 1, 0.5, true);
        let ids: Vec<u64> = (100..140).collect();
        let width = 9;
        let ones = vec![1.0f32; ids.len() * width];
        let mut fwd = vec![0.0f32; ones.len()];
        dropout(&key, &ids, &ones, width, &mut fwd);
        let mut back = ones.clone();
        dropout_backward(&key, &ids, &mut back, width);
        assert_eq!(fwd, back);
        assert!(fwd.contains(&0.0) && fwd.contains(&2.0));
    }
}
