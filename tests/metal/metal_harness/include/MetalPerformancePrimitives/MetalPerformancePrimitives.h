#pragma once
// Part of the MSL shim: see mh/all.h (the emulated subset of
// MetalPerformancePrimitives: mh/tensor.h). Empty while the harness scans
// sources.
#ifndef MH_SCAN
#include "mh/all.h"
#endif
