/* PF_CONFIG_INIT compiles without a warning as C11, C++11/17 and under
   nvcc, with -Wall -Wextra -Wmissing-field-initializers -Werror, and every
   field it leaves is zero (= default). */
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"

int main(void) {
    pf_config cfg = PF_CONFIG_INIT;
    return !(cfg.load == NULL && cfg.user == NULL && cfg.num_samples == 0 && cfg.num_samples_fn == NULL &&
             cfg.batch_size == 0 && cfg.batch_bytes == 0 && cfg.num_workers == 0 && cfg.host_slots == 0 &&
             cfg.device_slots == 0 && !cfg.shuffle && !cfg.unordered && !cfg.autotune && cfg.seed == 0 &&
             cfg.backend == PF_BACKEND_DEFAULT && cfg.stream == NULL && cfg.resume == NULL && cfg.log == NULL &&
             cfg.allocator.alloc_fn == NULL);
}
