// SPDX-License-Identifier: Apache-2.0
//
// The TensorRT version whose headers built this library, as a string in its read-only data.
// TensorRT 11 moved vtable slots of IPluginRegistry, ILogger and ILoggerFinder: a library built
// against one major version and loaded by the other crashes or mis-dispatches. graphfix reads
// this string from the file (graphfix/plugins/build.py, library_tensorrt_headers) before it
// loads the library or prints a trtexec line for it, without loading it.
#include "NvInferVersion.h"

#define GRAPHFIX_STRINGIFY_VALUE(x) #x
#define GRAPHFIX_STRINGIFY(x) GRAPHFIX_STRINGIFY_VALUE(x)

extern "C" __attribute__((used)) const char graphfixTensorrtHeaderVersion[]
    = "graphfix-tensorrt-headers=" GRAPHFIX_STRINGIFY(NV_TENSORRT_MAJOR) "." GRAPHFIX_STRINGIFY(
        NV_TENSORRT_MINOR) ";";
