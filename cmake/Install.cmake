# Install layout (GNUInstallDirs): tools in bin/, libucpkit and the GPU module in lib/, headers in
# include/ucpkit/, pattern files in share/ucpkit/patterns/, the Slurm job scripts (examples/slurm) in
# share/ucpkit/examples/slurm/, docs in share/doc/ucpkit/, man pages in share/man/man1/. Installed
# binaries find libucpkit through a relative RUNPATH ($ORIGIN/../lib), so a prefix can be moved; the
# build tree is never named (CMake strips the build RUNPATH on install).
include(GNUInstallDirs)
file(RELATIVE_PATH _ucpkit_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set(CMAKE_INSTALL_RPATH "$ORIGIN/${_ucpkit_bin_to_lib}")
# Keep the RUNPATH entries of libraries outside the build tree (OpenMPI's folder; CUDA's for the GPU module).
set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/patterns/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ucpkit/patterns
        COMPONENT runtime FILES_MATCHING PATTERN "*.json")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/slurm/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ucpkit/examples/slurm
        COMPONENT runtime USE_SOURCE_PERMISSIONS)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
