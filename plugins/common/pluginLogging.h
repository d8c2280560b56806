/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Error reporting shared by the plugins: a failing entry point reports through the logger that
 * TensorRT hands over with setLoggerFinder (the getCreators library), or on stderr when no logger
 * finder was given (the self-registering library: TensorRT offers it none).
 */
#ifndef GRAPHFIX_PLUGIN_LOGGING_H
#define GRAPHFIX_PLUGIN_LOGGING_H

#include "NvInferRuntime.h"

#include <stdexcept>
#include <string>

namespace graphfix
{
namespace plugin
{

//! A violated precondition; entry points catch it and report its message.
class PluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Throws PluginError(message) unless `condition` holds.
void check(bool condition, std::string const& message);

//! Remembers the logger finder that TensorRT passes to setLoggerFinder.
void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! Reports an error raised in `where` (an entry point's name).
void reportError(char const* where, char const* message) noexcept;

//! Reports the exception that reached entry point `where`; call inside a catch block.
void reportCurrentException(char const* where) noexcept;

//! Logs a message of any severity through the logger finder; without one, only warnings and more
//! severe messages go to stderr.
void reportMessage(nvinfer1::ILogger::Severity severity, char const* where, char const* message) noexcept;

} // namespace plugin
} // namespace graphfix

#endif // GRAPHFIX_PLUGIN_LOGGING_H
