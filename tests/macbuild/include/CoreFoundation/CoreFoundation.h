// Stand-in for Apple's CoreFoundation umbrella header, which no wheel ships
// and Apple's metal-cpp includes (Foundation/NSTypes.hpp) for one type.
// Only what metal-cpp's Foundation and Metal headers use is declared, each
// as Apple's header declares it; a metal-cpp release that needs more fails
// the macOS build check at its first use.
#pragma once

// CoreFoundation/CFDate.h: `typedef double CFTimeInterval;` (elapsed time in
// seconds). metal-cpp takes it in MTL::CommandBuffer's kernel/GPU start and
// end times, MTL::Drawable's presentation times and MTL::Device's
// timestamps.
typedef double CFTimeInterval;
