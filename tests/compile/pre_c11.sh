#!/bin/sh
# A pre-C11 compiler gets one clear line, not a page about timespec_get.
# Passes when `$1 -std=c99` (default $CC, gcc) refuses the implementation with prefetch.h's own
# #error naming the fix.
CC=${1:-${CC:-gcc}}
out=$($CC -std=c99 -fsyntax-only -x c - 2>&1 <<'SRC'
#define PREFETCH_IMPLEMENTATION
#include "prefetch.h"
SRC
)
case "$out" in
*"prefetch.h: the implementation (PREFETCH_IMPLEMENTATION) needs C11 or later: compile this file with -std=c11"*)
    echo "pre-C11: refused with prefetch.h's #error"; exit 0 ;;
*)
    echo "pre-C11: expected prefetch.h's #error, got:"; echo "$out" | head -5; exit 1 ;;
esac
