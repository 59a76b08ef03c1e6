# Which OpenBLAS the binaries load. LibTorch runs its own work on an OpenMP
# pool sized by the intra-op thread count; Debian's default OpenBLAS
# (openblas-pthread) keeps a second pool of its own threads, one per core,
# whatever that count says. The two then share the cores: OpenMP threads
# spin after each parallel region while the BLAS threads want the same
# cores for the next product, and the BLAS uses every core even in a worker
# whose placement gave it one. Debian's OpenMP build of the same OpenBLAS
# (openblas-openmp, package libopenblas0-openmp) runs its products on
# LibTorch's pool instead, so `--threads` and cpu_threads_per_slot govern
# both. When it is installed, the binaries look for libblas.so.3 there first
# (an RPATH, which also applies to LibTorch's own libraries). Measured in
# docs/benchmarks.md; `roll bench train|generate` print the BLAS they ran.
#
# PyPI's torch carries its BLAS inside libtorch_cpu (MKL, on the same OpenMP
# pool) and loads no system libblas: there this file does nothing.
set(_roll_blas_default "")
if(ROLL_TORCH_NEEDED MATCHES "libblas\\.so")
  set(_roll_blas_default "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
elseif(ROLL_TORCH_NEEDED)
  message(STATUS "roll: LibTorch carries its own BLAS (no libblas.so.3 among its libraries)")
endif()
set(ROLL_OPENMP_BLAS_DIR "${_roll_blas_default}"
    CACHE PATH "Directory of the OpenMP build of OpenBLAS (empty: the system default BLAS, or LibTorch's own)")
set(ROLL_USES_OPENMP_BLAS OFF)
if(ROLL_OPENMP_BLAS_DIR AND EXISTS "${ROLL_OPENMP_BLAS_DIR}/libblas.so.3")
  set(ROLL_USES_OPENMP_BLAS ON)
  list(APPEND CMAKE_BUILD_RPATH "${ROLL_OPENMP_BLAS_DIR}")
  list(APPEND CMAKE_INSTALL_RPATH "${ROLL_OPENMP_BLAS_DIR}")
  # DT_RPATH rather than DT_RUNPATH: only the former is searched for the
  # dependencies of LibTorch's libraries (which carry no path of their own).
  add_link_options("LINKER:--disable-new-dtags")
  message(STATUS "roll: OpenBLAS (OpenMP build) from ${ROLL_OPENMP_BLAS_DIR}")
elseif(ROLL_OPENMP_BLAS_DIR)
  message(WARNING "roll: no OpenMP build of OpenBLAS at '${ROLL_OPENMP_BLAS_DIR}' "
                  "(Debian: libopenblas0-openmp); the system BLAS keeps its own threads")
else()
  message(STATUS "roll: no OpenBLAS chosen (ROLL_OPENMP_BLAS_DIR is empty): LibTorch's own BLAS or the system default")
endif()
# Whether the products run on LibTorch's OpenMP pool, so that --threads
# governs them (the CLI test checks it): the OpenMP OpenBLAS loaded above,
# or a BLAS inside LibTorch (MKL in PyPI's wheel).
set(ROLL_BLAS_ON_TORCH_POOL ${ROLL_USES_OPENMP_BLAS})
if(ROLL_TORCH_NEEDED AND NOT ROLL_TORCH_NEEDED MATCHES "libblas\\.so")
  set(ROLL_BLAS_ON_TORCH_POOL ON)
endif()
