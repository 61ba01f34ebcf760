// Compile shim for nvFuser 3fe1c3212 on CUDA 13 headers (force-included with `-include`).
//
// nvFuser's csrc/driver_api.h at that commit declares its lazily loaded driver entry points
// with the unversioned `PFN_cu<Name>` typedefs, which CUDA 12's cudaTypedefs.h provided as
// aliases of the versioned ones and CUDA 13's no longer does. This header defines each one it
// uses as the type of the function cuda.h declares under that name (cuda.h maps the name to
// the current version, e.g. cuMemGetAddressRange -> cuMemGetAddressRange_v2, which is also the
// version cudaGetDriverEntryPoint returns by default). Nothing is defined when the CUDA headers
// are not on the include path (non-CUDA targets of the same build) or when cudaTypedefs.h
// already provides the alias (CUDA 12).
#pragma once
#if defined(__cplusplus) && __has_include(<cudaTypedefs.h>)
#include <cuda.h>
#include <cudaTypedefs.h>

#define NVFIPC_SEED_PFN(name) typedef decltype(&::name) PFN_##name;
#ifndef PFN_cuDeviceGetAttribute
NVFIPC_SEED_PFN(cuDeviceGetAttribute)
#endif
#ifndef PFN_cuDeviceGetName
NVFIPC_SEED_PFN(cuDeviceGetName)
#endif
#ifndef PFN_cuFuncGetAttribute
NVFIPC_SEED_PFN(cuFuncGetAttribute)
#endif
#ifndef PFN_cuFuncSetAttribute
NVFIPC_SEED_PFN(cuFuncSetAttribute)
#endif
#ifndef PFN_cuGetErrorName
NVFIPC_SEED_PFN(cuGetErrorName)
#endif
#ifndef PFN_cuGetErrorString
NVFIPC_SEED_PFN(cuGetErrorString)
#endif
#ifndef PFN_cuLaunchCooperativeKernel
NVFIPC_SEED_PFN(cuLaunchCooperativeKernel)
#endif
#ifndef PFN_cuLaunchKernel
NVFIPC_SEED_PFN(cuLaunchKernel)
#endif
#ifndef PFN_cuModuleGetFunction
NVFIPC_SEED_PFN(cuModuleGetFunction)
#endif
#ifndef PFN_cuModuleLoadDataEx
NVFIPC_SEED_PFN(cuModuleLoadDataEx)
#endif
#ifndef PFN_cuModuleUnload
NVFIPC_SEED_PFN(cuModuleUnload)
#endif
#ifndef PFN_cuStreamWriteValue32
NVFIPC_SEED_PFN(cuStreamWriteValue32)
#endif
#ifndef PFN_cuStreamWaitValue32
NVFIPC_SEED_PFN(cuStreamWaitValue32)
#endif
#ifndef PFN_cuMemGetAddressRange
NVFIPC_SEED_PFN(cuMemGetAddressRange)
#endif
#ifndef PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor
NVFIPC_SEED_PFN(cuOccupancyMaxActiveBlocksPerMultiprocessor)
#endif
#ifndef PFN_cuTensorMapEncodeTiled
NVFIPC_SEED_PFN(cuTensorMapEncodeTiled)
#endif
#undef NVFIPC_SEED_PFN
#endif
