/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "pluginLogging.h"

#include <atomic>
#include <cstdio>
#include <exception>

namespace graphfix
{
namespace plugin
{
namespace
{

std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};

} // namespace

void check(bool condition, std::string const& message)
{
    if (!condition)
    {
        throw PluginError(message);
    }
}

void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    gLoggerFinder.store(finder);
}

void reportError(char const* where, char const* message) noexcept
{
    try
    {
        std::string const text = std::string{"graphfix plugin: "} + where + ": " + message;
        nvinfer1::ILoggerFinder* const finder = gLoggerFinder.load();
        nvinfer1::ILogger* const logger = finder != nullptr ? finder->findLogger() : nullptr;
        if (logger != nullptr)
        {
            logger->log(nvinfer1::ILogger::Severity::kERROR, text.c_str());
            return;
        }
        std::fprintf(stderr, "[E] %s\n", text.c_str());
    }
    catch (...)
    {
        std::fprintf(stderr, "[E] graphfix plugin: %s: %s\n", where, message);
    }
}

void reportCurrentException(char const* where) noexcept
{
    try
    {
        throw;
    }
    catch (std::exception const& e)
    {
        reportError(where, e.what());
    }
    catch (...)
    {
        reportError(where, "unknown exception");
    }
}

void reportMessage(nvinfer1::ILogger::Severity severity, char const* where, char const* message) noexcept
{
    try
    {
        std::string const text = std::string{"graphfix plugin: "} + where + ": " + message;
        nvinfer1::ILoggerFinder* const finder = gLoggerFinder.load();
        nvinfer1::ILogger* const logger = finder != nullptr ? finder->findLogger() : nullptr;
        if (logger != nullptr)
        {
            logger->log(severity, text.c_str());
        }
        else if (severity <= nvinfer1::ILogger::Severity::kWARNING)
        {
            std::fprintf(stderr, "[W] %s\n", text.c_str());
        }
    }
    catch (...)
    {
        std::fprintf(stderr, "[W] graphfix plugin: %s: %s\n", where, message);
    }
}

} // namespace plugin
} // namespace graphfix
