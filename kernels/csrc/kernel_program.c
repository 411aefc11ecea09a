/* A recorded sequence of packed-argument kernel calls, run in one call from Python
   (kernels/kernel_program.py): the calls of a decode step without Python, and without the gaps
   between them in which OpenMP's workers go to sleep. */

#include <stdint.h>

typedef int64_t (*packed_kernel)(const int64_t* args);

/* Calls kernels[i](args[i]) for i = 0 .. count - 1 in order. Returns 0, or i + 1 for the first call
   that returned nonzero (its status in *status; the later calls are not made). */
int64_t run_kernel_program(int64_t count, const int64_t* kernels, const int64_t* args, int64_t* status) {
  for (int64_t i = 0; i < count; i++) {
    int64_t result = ((packed_kernel)(intptr_t)kernels[i])((const int64_t*)(intptr_t)args[i]);
    if (result) {
      *status = result;
      return i + 1;
    }
  }
  return 0;
}
