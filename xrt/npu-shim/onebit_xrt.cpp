// The C++ side of onebit_xrt.h over XRT's C++ API. Every entry point is a try/catch that turns
// any exception into OBX_ERROR plus its message.
#include "onebit_xrt.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <exception>
#include <memory>
#include <string>

#include <xrt/xrt_bo.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_kernel.h>
#include <xrt/xrt_uuid.h>
#include <version.h>
#ifdef ONEBIT_XRT_HW_CONTEXT
#include <xrt/xrt_hw_context.h>
#endif

struct obx_device {
  xrt::device device;
  xrt::uuid uuid;
#ifdef ONEBIT_XRT_HW_CONTEXT
  xrt::hw_context context;
#endif
};

struct obx_bo {
  xrt::bo bo;
};

namespace {
void say(char *err, size_t len, const char *msg) {
  if (err && len) {
    std::strncpy(err, msg, len - 1);
    err[len - 1] = '\0';
  }
}

template <typename F> int guard(char *err, size_t len, F f) {
  try {
    f();
    return OBX_OK;
  } catch (const std::exception &e) {
    say(err, len, e.what());
  } catch (...) {
    say(err, len, "unknown exception from XRT");
  }
  return OBX_ERROR;
}

xrt::kernel kernel_of(obx_device *dev, const char *name) {
#ifdef ONEBIT_XRT_HW_CONTEXT
  return xrt::kernel(dev->context, name);
#else
  return xrt::kernel(dev->device, dev->uuid, name);
#endif
}
}  // namespace

extern "C" {

const char *obx_api(void) {
#ifdef ONEBIT_XRT_HW_CONTEXT
  return "hw_context";
#else
  return "xclbin-load";
#endif
}

const char *obx_xrt_version(void) { return xrt_build_version; }

int obx_open(unsigned index, obx_device **out, char *err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto d = std::make_unique<obx_device>();
    d->device = xrt::device(index);
    *out = d.release();
  });
}

void obx_close(obx_device *dev) {
  try {
    delete dev;
  } catch (...) {
  }
}

int obx_load_xclbin(obx_device *dev, const char *path, char *err, size_t err_len) {
  return guard(err, err_len, [&] {
#ifdef ONEBIT_XRT_HW_CONTEXT
    xrt::xclbin x(std::string(path));
    dev->device.register_xclbin(x);
    dev->uuid = x.get_uuid();
    dev->context = xrt::hw_context(dev->device, dev->uuid);
#else
    dev->uuid = dev->device.load_xclbin(std::string(path));
#endif
  });
}

int obx_bo_alloc(obx_device *dev, const char *kernel, unsigned arg, size_t bytes, obx_bo **out,
                 char *err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto k = kernel_of(dev, kernel);
    auto b = std::make_unique<obx_bo>();
    b->bo = xrt::bo(dev->device, bytes, xrt::bo::flags::host_only, k.group_id(static_cast<int>(arg)));
    *out = b.release();
  });
}

void obx_bo_free(obx_bo *bo) {
  try {
    delete bo;
  } catch (...) {
  }
}

int obx_bo_write(obx_bo *bo, const void *src, size_t n, size_t offset, char *err, size_t err_len) {
  return guard(err, err_len, [&] {
    bo->bo.write(src, n, offset);
    bo->bo.sync(XCL_BO_SYNC_BO_TO_DEVICE, n, offset);
  });
}

int obx_bo_read(obx_bo *bo, void *dst, size_t n, size_t offset, char *err, size_t err_len) {
  return guard(err, err_len, [&] {
    bo->bo.sync(XCL_BO_SYNC_BO_FROM_DEVICE, n, offset);
    bo->bo.read(dst, n, offset);
  });
}

int obx_run(obx_device *dev, const char *kernel, obx_bo *const *args, size_t nargs,
            unsigned timeout_ms, char *err, size_t err_len) {
  return guard(err, err_len, [&] {
    auto k = kernel_of(dev, kernel);
    xrt::run run(k);
    for (size_t i = 0; i < nargs; ++i) run.set_arg(static_cast<int>(i), args[i]->bo);
    run.start();
    auto state = run.wait(std::chrono::milliseconds(timeout_ms));
    if (state != ERT_CMD_STATE_COMPLETED)
      throw std::runtime_error("kernel run did not complete (state " + std::to_string(state) + ")");
  });
}

}  // extern "C"
