//! The header of a NumPy `.npy` file (format 1.0), written: the trainer writes its predictions
//! as `.npy` files and the graph generators their arrays; the readers are the preprocessing's.

use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;

/// First bytes of a `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Element types of a `.npy` file written on its own, outside an archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyElement {
    /// Little-endian `f32` (`<f4`).
    F32,
    /// Little-endian `i64` (`<i8`).
    I64,
    /// `u8` (`|u1`).
    U8,
}

impl NpyElement {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NpyElement::F32 => 4,
            NpyElement::I64 => 8,
            NpyElement::U8 => 1,
        }
    }

    /// NumPy's `descr` of the element type (`<f4`, `<i8`, `|u1`).
    pub fn descr(self) -> &'static str {
        match self {
            NpyElement::F32 => "<f4",
            NpyElement::I64 => "<i8",
            NpyElement::U8 => "|u1",
        }
    }
}

/// The header of a `.npy` file (format 1.0, C order) holding `element`s of `shape`, padded to a
/// multiple of 64 bytes: the data follows it, row after row (`distspmm predict` writes each
/// row at `header.len() + row · row bytes`).
pub fn npy_file_header(element: NpyElement, shape: &[u64]) -> Vec<u8> {
    header_text(element.descr(), false, shape)
}

/// A format-1.0 header for any `descr` (C order unless `fortran`), padded to a multiple of 64
/// bytes (the readers' tests also build invalid ones with it).
pub fn header_text(descr: &str, fortran: bool, shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let fortran = if fortran { "True" } else { "False" };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {dims}, }}");
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.extend(core::iter::repeat_n(
        ' ',
        unpadded.next_multiple_of(64) - unpadded,
    ));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the header dict is a few fields and its padding, far below 64 KiB"
    )]
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}
