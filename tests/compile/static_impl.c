/* static_impl.c - PREFETCH_STATIC: every function private to this file, and
   no warning for the ones it does not call. */
#define PREFETCH_STATIC
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"
#include <stdio.h>

int main(void) {
    int ok = pf_result_string(PF_ERR_LOAD) != NULL && pf_error(NULL) != NULL;
    printf("PREFETCH_STATIC build: %s\nRESULT %d %d 0\n", ok ? "ok" : "FAILED", ok, !ok);
    return !ok;
}
