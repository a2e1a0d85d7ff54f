// Metal objects live behind pointers: metal-cpp deletes their constructors,
// copies and destructor. Reference counting goes through retain / release
// or NS::SharedPtr.
#include <Metal/Metal.hpp>

NS::SharedPtr<MTL::Buffer> keep(MTL::Buffer* buf) {
#if MACHOST_BAD == 1
  MTL::Buffer copy = *buf; // MACHOST-ERROR 1
#endif
#if MACHOST_BAD == 2
  delete buf; // MACHOST-ERROR 2
#endif
  MTL::Resource* resource = buf; // a Buffer is a Resource
#if MACHOST_BAD == 3
  MTL::Buffer* back = resource; // MACHOST-ERROR 3
#endif
  resource->retain()->release();
  return NS::RetainPtr(buf);
}
