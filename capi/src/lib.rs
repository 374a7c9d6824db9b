//! The C ABI boundary of distspmm (`libdistspmm.so`, `include/distspmm.h`).
