/* two_tu_impl.c - the implementation lives here, once. */
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"
