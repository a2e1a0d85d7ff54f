// Stand-in for Apple's metal-cpp Foundation/Foundation.hpp, for compile
// checks of the Mac host code on Linux (tests/test_mac_host_build.py).
//
// Declarations only, with metal-cpp's names, signatures and class hierarchy,
// and only the entities that MLX's Metal headers and mlx_lattice use: a call
// to anything else, or with other argument types, must not compile here
// either. Nothing is defined (the check is -fsyntax-only). Objects are never
// constructed, copied or destroyed by value, as in metal-cpp (NS::Object
// deletes those members); they live behind pointers and NS::SharedPtr.
#pragma once

#include <cstdint>
#include <type_traits>

namespace NS {

using Integer = std::intptr_t;
using UInteger = std::uintptr_t;

enum StringEncoding : UInteger {
  ASCIIStringEncoding = 1,
  UTF8StringEncoding = 4,
};

// The root of every Foundation and Metal class. metal-cpp derives it from
// Referencing<Object, objc_object>; the Objective-C base adds nothing a C++
// caller can name, so the reference-counting members sit here directly.
class Object {
 public:
  Object() = delete;
  Object(const Object&) = delete;
  ~Object() = delete;
  Object& operator=(const Object&) = delete;

  Object* retain();
  void release();
  Object* autorelease();
  [[nodiscard]] UInteger retainCount() const;
};

template <class _Class, class _Base = Object>
class Referencing : public _Base {
 public:
  _Class* retain();
  void release();
  _Class* autorelease();
  [[nodiscard]] UInteger retainCount() const;
};

template <class _Class, class _Base = Object>
class Copying : public Referencing<_Class, _Base> {
 public:
  _Class* copy() const;
};

class String : public Copying<String> {
 public:
  static String* string(const char* pString, StringEncoding encoding);
  [[nodiscard]] const char* utf8String() const;
};

class AutoreleasePool : public Object {
 public:
  static AutoreleasePool* alloc();
  AutoreleasePool* init();
  void drain();
};

// Owning pointer: retains on copy, releases on destruction.
template <class _Class>
class SharedPtr {
 public:
  SharedPtr();
  ~SharedPtr();
  SharedPtr(const SharedPtr<_Class>& other) noexcept;
  template <class _OtherClass>
  explicit SharedPtr(
      const SharedPtr<_OtherClass>& other,
      std::enable_if_t<std::is_convertible_v<_OtherClass*, _Class*>>* = nullptr) noexcept;
  SharedPtr(SharedPtr<_Class>&& other) noexcept;
  template <class _OtherClass>
  explicit SharedPtr(
      SharedPtr<_OtherClass>&& other,
      std::enable_if_t<std::is_convertible_v<_OtherClass*, _Class*>>* = nullptr) noexcept;

  SharedPtr& operator=(const SharedPtr<_Class>& other);
  template <class _OtherClass>
  std::enable_if_t<std::is_convertible_v<_OtherClass*, _Class*>, SharedPtr&>
  operator=(const SharedPtr<_OtherClass>& other);
  SharedPtr& operator=(SharedPtr<_Class>&& other) noexcept;
  template <class _OtherClass>
  std::enable_if_t<std::is_convertible_v<_OtherClass*, _Class*>, SharedPtr&>
  operator=(SharedPtr<_OtherClass>&& other);

  _Class* get() const;
  _Class* operator->() const;
  explicit operator bool() const;
  void reset();
  void detach();

 private:
  _Class* m_pObject;
};

template <class _Class>
SharedPtr<_Class> RetainPtr(_Class* pObject);
template <class _Class>
SharedPtr<_Class> TransferPtr(_Class* pObject);

} // namespace NS

template <class _ClassLhs, class _ClassRhs>
bool operator==(const NS::SharedPtr<_ClassLhs>& lhs, const NS::SharedPtr<_ClassRhs>& rhs);
template <class _ClassLhs, class _ClassRhs>
bool operator!=(const NS::SharedPtr<_ClassLhs>& lhs, const NS::SharedPtr<_ClassRhs>& rhs);
