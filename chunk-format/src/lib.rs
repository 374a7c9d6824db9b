//! The on-disk chunk: what one rank loads (its rows of Â split by source part, halo lists,
//! features, labels, masks). `#![no_std]` + `alloc`; the writer needs `std`.
#![no_std]
