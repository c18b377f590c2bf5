/* A stand-in libcuda.so.1 for CPU-only hosts, built by setup.sh.
 *
 * PyPI's sglang-kernel wheel is CUDA-only and its shared objects link libcuda.so.1; on a
 * machine without the NVIDIA driver, `import sgl_kernel` (and so SGLang's startup) fails with
 * "libcuda.so.1: cannot open shared object file". This library gives the loader the symbols
 * those objects reference; every driver call answers CUDA_ERROR_NO_DEVICE (100), so torch
 * sees no GPU and SGLang takes its native torch (CPU) paths. */
#define CUDA_ERROR_NO_DEVICE 100
int cuInit(void) { return CUDA_ERROR_NO_DEVICE; }
int cuDriverGetVersion(void) { return CUDA_ERROR_NO_DEVICE; }
int cuDeviceGetCount(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGetErrorString(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGetProcAddress(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGetProcAddress_v2(void) { return CUDA_ERROR_NO_DEVICE; }
int cuCtxFromGreenCtx(void) { return CUDA_ERROR_NO_DEVICE; }
int cuCtxPopCurrent_v2(void) { return CUDA_ERROR_NO_DEVICE; }
int cuCtxPushCurrent_v2(void) { return CUDA_ERROR_NO_DEVICE; }
int cuDevResourceGenerateDesc(void) { return CUDA_ERROR_NO_DEVICE; }
int cuDevSmResourceSplitByCount(void) { return CUDA_ERROR_NO_DEVICE; }
int cuDeviceGetDevResource(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGreenCtxCreate(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGreenCtxDestroy(void) { return CUDA_ERROR_NO_DEVICE; }
int cuGreenCtxGetDevResource(void) { return CUDA_ERROR_NO_DEVICE; }
int cuPointerGetAttribute(void) { return CUDA_ERROR_NO_DEVICE; }
int cuStreamCreate(void) { return CUDA_ERROR_NO_DEVICE; }
