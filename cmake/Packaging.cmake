# Debian packages through CPack (`cpack -G DEB` in the build folder, docs/install.md):
#   ucpkit      the tools, libucpkit, headers, pattern files, docs and man pages; its dependencies are
#               Debian packages computed by dpkg-shlibdeps (libtbb12, libopenmpi3, libzstd1, ...)
#   ucpkit-gpu  the GPU module libucpkit_gpu.so (when UCPKIT_CUDA is ON); it needs the CUDA runtime and
#               NCCL from /usr/local/cuda, which no Debian package provides, so its dependencies are
#               not computed (ucp-load --device cuda says so when they are missing)
set(CPACK_PACKAGE_NAME ucpkit)
set(CPACK_PACKAGE_VENDOR "ucpkit")
set(CPACK_PACKAGE_CONTACT "ucpkit maintainers <ucpkit@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Checkpoint conversion, partial expert checkpointing and expert placement tools for LLM training")
set(CPACK_PACKAGE_INSTALL_DIRECTORY ucpkit)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime)
if(UCPKIT_CUDA)
  list(APPEND CPACK_COMPONENTS_ALL gpu)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ucpkit)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# mpirun for the multi-process forms (the tools also run as one process without it).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "openmpi-bin")
set(CPACK_DEBIAN_GPU_PACKAGE_NAME ucpkit-gpu)
set(CPACK_DEBIAN_GPU_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_GPU_PACKAGE_DEPENDS "ucpkit (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_GPU_DESCRIPTION "GPU module of ucpkit (ucp-load --device cuda; needs CUDA and NCCL in /usr/local/cuda)")
include(CPack)
