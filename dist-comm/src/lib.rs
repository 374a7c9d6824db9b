//! Communicators that move the bytes a distspmm schedule asks for: MPI, in-process threads, NCCL.
