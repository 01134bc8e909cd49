/* Compiles cuda_kernels.cu as host C++ for the emulator (see emu/cu_emu.h): a separate file, because
 * a source file can have only one language in CMake and the .cu is also built by nvcc. */
#include "../cuda_kernels.cu"
