// The link leaves only Python's API to the interpreter: a function that no
// linked library defines (declared, never defined) fails the check at the
// link, as it fails a Mac build's link; Python's own stays undefined.
#include <Python.h>

extern "C" long lattice_selftest_nowhere(long);

extern "C" PyObject* lattice_selftest(PyObject* arg) {
  long v = PyLong_AsLong(arg);
#if MACBUILD_BAD == 1
  v = lattice_selftest_nowhere(v); // MACBUILD-LINK 1
#endif
  return PyLong_FromLong(v + 1);
}
