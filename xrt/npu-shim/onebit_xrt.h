/* onebit_xrt: the C face of XRT that onebit-runtime's NPU backend binds (bindgen reads this
 * header). Every call catches every C++ exception and returns a status with the message in
 * `err`: an exception crossing into Rust would abort the process. */
#ifndef ONEBIT_XRT_H
#define ONEBIT_XRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** An opened device (xrt::device, plus the uuid of the loaded xclbin). */
typedef struct obx_device obx_device;
/** A buffer object (xrt::bo). */
typedef struct obx_bo obx_bo;

/** Status codes: 0 = success. */
enum obx_status { OBX_OK = 0, OBX_ERROR = 1 };

/** Which XRT API this shim was built against ("xclbin-load" for XRT < 2.17, "hw_context"). */
const char *obx_api(void);

/** XRT's version string as built against. */
const char *obx_xrt_version(void);

/** Opens device `index`. */
int obx_open(unsigned index, obx_device **out, char *err, size_t err_len);

/** Closes a device (NULL is ignored). */
void obx_close(obx_device *dev);

/** Loads an xclbin file (and, with hw_context, creates the context for it). */
int obx_load_xclbin(obx_device *dev, const char *path, char *err, size_t err_len);

/** Allocates a buffer of `bytes` in the memory group of argument `arg` of `kernel`. */
int obx_bo_alloc(obx_device *dev, const char *kernel, unsigned arg, size_t bytes, obx_bo **out,
                 char *err, size_t err_len);

/** Frees a buffer (NULL is ignored). */
void obx_bo_free(obx_bo *bo);

/** Copies `n` bytes from `src` into the buffer at `offset` and syncs it to the device. */
int obx_bo_write(obx_bo *bo, const void *src, size_t n, size_t offset, char *err, size_t err_len);

/** Syncs the buffer from the device and copies `n` bytes at `offset` into `dst`. */
int obx_bo_read(obx_bo *bo, void *dst, size_t n, size_t offset, char *err, size_t err_len);

/** Runs `kernel` with buffers as its arguments in order and waits up to `timeout_ms`. */
int obx_run(obx_device *dev, const char *kernel, obx_bo *const *args, size_t nargs,
            unsigned timeout_ms, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
