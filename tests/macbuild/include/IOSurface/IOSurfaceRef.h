// Stand-in for Apple's IOSurface/IOSurfaceRef.h, which no wheel ships and
// Apple's metal-cpp includes (Metal/MTLDevice.hpp, Metal/MTLTexture.hpp) for
// one type, in MTL::Device::newTexture(descriptor, iosurface, plane) and
// MTL::Texture::iosurface().
#pragma once

// IOSurface/IOSurfaceRef.h: `typedef struct CF_BRIDGED_TYPE(id) __IOSurface
// *IOSurfaceRef;`, an opaque Core Foundation object. CF_BRIDGED_TYPE is an
// Objective-C bridging attribute with no effect on C++; the struct's tag is
// kept, since it is part of the mangled name of any C++ function taking an
// IOSurfaceRef.
typedef struct __IOSurface* IOSurfaceRef;
