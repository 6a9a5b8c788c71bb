#!/bin/sh
# cuda_shapes.sh - header surfaces of older CUDA toolkits, derived from the
# installed one, so `make test` compiles prefetch.h's CUDA backend as a user
# on CUDA 11.8, 12.4 or 12.8 would, without those toolkits installed.
#
#   sh tests/cuda_shapes.sh CUDA_INCLUDE_DIR OUT_DIR
#
# For each version V it makes OUT_DIR/V/include: a tree of symbolic links to
# CUDA_INCLUDE_DIR, with the few headers it changes copied and edited:
# CUDART_VERSION (cuda_runtime_api.h) and CUDA_VERSION (cuda.h) set to V, and
# every symbol V lacks among those the driver-entry-point path uses taken
# away (or given V's signature). Each change below cites the NVIDIA runtime
# API reference of the version that shows it:
#
#  [1] CUDA 11.4.4 / 11.7.0, "Driver Entry Point Access":
#      https://docs.nvidia.com/cuda/archive/11.4.4/cuda-runtime-api/group__CUDART__DRIVER__ENTRY__POINT.html
#      https://docs.nvidia.com/cuda/archive/11.7.0/cuda-runtime-api/group__CUDART__DRIVER__ENTRY__POINT.html
#      "__host__ cudaError_t cudaGetDriverEntryPoint ( const char* symbol,
#      void** funcPtr, unsigned long long flags )" -- three arguments, no
#      cudaDriverEntryPointQueryResult; "The API will return
#      cudaErrorSymbolNotFound if the requested driver function is not
#      supported on the platform". 11.x keeps that shape through 11.8.
#  [2] CUDA 12.0.0, same section:
#      https://docs.nvidia.com/cuda/archive/12.0.0/cuda-runtime-api/group__CUDART__DRIVER__ENTRY__POINT.html
#      "cudaGetDriverEntryPoint ( const char* symbol, void** funcPtr,
#      unsigned long long flags, cudaDriverEntryPointQueryResult **
#      driverStatus = NULL )": the fourth argument and its enum arrive in 12.0.
#  [3] CUDA 12.4.1, same section:
#      https://docs.nvidia.com/cuda/archive/12.4.1/cuda-runtime-api/group__CUDART__DRIVER__ENTRY__POINT.html
#      lists cudaGetDriverEntryPoint only: no cudaGetDriverEntryPointByVersion
#      before 12.5.
#  [4] The current reference (CUDA 12.5 on):
#      https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__DRIVER__ENTRY__POINT.html
#      lists both, "cudaGetDriverEntryPointByVersion ( const char* symbol,
#      void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
#      cudaDriverEntryPointQueryResult* driverStatus = NULL )".
#  [5] CUDA 13.x, same section:
#      https://docs.nvidia.com/cuda/developer-preview/13.4/cuda-runtime-api/cuda_runtime_api/group__CUDART__DRIVER__ENTRY__POINT.html
#      cudaGetDriverEntryPoint: "Deprecated: This function is deprecated as of
#      CUDA 13.0" -- so before 13.0 the declaration carries no
#      __CUDA_DEPRECATED.
#
# Each edit is checked: if the installed header's text is not what the edit
# expects (a newer toolkit rearranged it), the script fails and says which,
# rather than producing a header that silently still has the symbol.
set -eu
inc=${1:?usage: cuda_shapes.sh CUDA_INCLUDE_DIR OUT_DIR}
out=${2:?usage: cuda_shapes.sh CUDA_INCLUDE_DIR OUT_DIR}
api=$inc/cuda_runtime_api.h
[ -f "$api" ] || { echo "cuda_shapes: no $api" >&2; exit 1; }
have=$(sed -n 's/^#define CUDART_VERSION[ \t]*\([0-9]*\).*/\1/p' "$api")
[ -n "$have" ] || { echo "cuda_shapes: no CUDART_VERSION in $api" >&2; exit 1; }

die() { echo "cuda_shapes: $V: $*" >&2; exit 1; }
# own FILE: replace the link with a private copy to edit
own() { rm -f "$d/$1"; cp "$inc/$1" "$d/$1"; chmod u+w "$d/$1"; }
# gone FILE WORD: no line of FILE may mention WORD
gone() { ! grep -q "$2" "$d/$1" || die "$2 is still in $1"; }

for V in 11.8 12.4 12.8; do
    num=$(echo "$V" | awk -F. '{ print $1 * 1000 + $2 * 10 }')
    if [ "$num" -ge "$have" ]; then
        echo "cuda_shapes: the installed toolkit is CUDART_VERSION $have, not newer than $V: no $V shape" >&2
        continue
    fi
    d=$out/$V/include
    rm -rf "$out/$V"
    mkdir -p "$d"
    cp -rs "$(cd "$inc" && pwd)/." "$d/"
    own cuda_runtime_api.h
    own cuda.h
    own driver_types.h
    sed -i "s/^#define CUDART_VERSION[ \t]*[0-9]*/#define CUDART_VERSION  $num/" "$d/cuda_runtime_api.h"
    grep -q "^#define CUDART_VERSION  $num\$" "$d/cuda_runtime_api.h" || die "could not set CUDART_VERSION"
    sed -i "s/^#define CUDA_VERSION [0-9]*/#define CUDA_VERSION $num/" "$d/cuda.h"
    grep -q "^#define CUDA_VERSION $num\$" "$d/cuda.h" || die "could not set CUDA_VERSION"
    # [5] not deprecated before 13.0
    sed -i 's/__CUDA_DEPRECATED \(__host__ cudaError_t CUDARTAPI cudaGetDriverEntryPoint(\)/\1/' "$d/cuda_runtime_api.h"
    gone cuda_runtime_api.h "__CUDA_DEPRECATED __host__ cudaError_t CUDARTAPI cudaGetDriverEntryPoint("
    if [ "$num" -lt 12050 ]; then
        # [3], [4]: cudaGetDriverEntryPointByVersion is 12.5's
        sed -i '/cudaGetDriverEntryPointByVersion/d' "$d/cuda_runtime_api.h"
        gone cuda_runtime_api.h cudaGetDriverEntryPointByVersion
    fi
    if [ "$num" -lt 12000 ]; then
        # [1], [2]: three arguments, and no cudaDriverEntryPointQueryResult
        sed -i 's/\(cudaGetDriverEntryPoint(const char \*symbol, void \*\*funcPtr, unsigned long long flags\), enum cudaDriverEntryPointQueryResult \*driverStatus\( = NULL\)\{0,1\});/\1);/' \
            "$d/cuda_runtime_api.h"
        sed -i '/^enum __device_builtin__ cudaDriverEntryPointQueryResult {/,/^};/d' "$d/driver_types.h"
        # the 13.0 header's prose still names it in comments; declarations may not
        if grep -v '^ \*' "$d/cuda_runtime_api.h" | grep -q cudaDriverEntryPointQueryResult; then
            die "cudaDriverEntryPointQueryResult is still declared in cuda_runtime_api.h"
        fi
        gone driver_types.h cudaDriverEntryPointQueryResult
    fi
    echo "cuda_shapes: $d (CUDART_VERSION $num)"
done
