//! Hand-written CUDA SpMM kernels (CSR forward, CSC transpose) and their launches.
