// Closes the instruction-set region opened by cpu/isa_begin.h.
#if (LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 2) && defined(__clang__)
#pragma clang attribute pop
#elif LATTICE_ISA_ID == 1 || LATTICE_ISA_ID == 2
#pragma GCC pop_options
#endif
