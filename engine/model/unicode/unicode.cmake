# Unicode category tables for the tokenizers, generated at build time from the Unicode
# Character Database on the build machine (Debian/Ubuntu package `unicode-data`), so no
# generated table lives in the repository. Included from engine/CMakeLists.txt after the
# kvfs_engine target exists.

set(KVFS_UNICODE_DATA "/usr/share/unicode/UnicodeData.txt" CACHE FILEPATH
    "UnicodeData.txt used to generate the tokenizer's Unicode tables")
if(NOT EXISTS "${KVFS_UNICODE_DATA}")
  message(FATAL_ERROR
    "UnicodeData.txt not found at '${KVFS_UNICODE_DATA}'. The tokenizers' Unicode tables are "
    "generated from it at build time: install it (apt-get install unicode-data) or point "
    "-DKVFS_UNICODE_DATA=/path/to/UnicodeData.txt at a copy.")
endif()

find_package(Python3 COMPONENTS Interpreter REQUIRED)

set(KVFS_UNICODE_GENERATOR "${CMAKE_CURRENT_LIST_DIR}/gen_unicode_tables.py")
set(KVFS_UNICODE_TABLES "${CMAKE_CURRENT_BINARY_DIR}/generated/unicode_tables.inc")

add_custom_command(
  OUTPUT "${KVFS_UNICODE_TABLES}"
  COMMAND ${CMAKE_COMMAND} -E make_directory "${CMAKE_CURRENT_BINARY_DIR}/generated"
  COMMAND Python3::Interpreter "${KVFS_UNICODE_GENERATOR}"
          --input "${KVFS_UNICODE_DATA}" --output "${KVFS_UNICODE_TABLES}"
  DEPENDS "${KVFS_UNICODE_GENERATOR}" "${KVFS_UNICODE_DATA}"
  COMMENT "Generating Unicode tables from ${KVFS_UNICODE_DATA}"
  VERBATIM)

# A target owns the generated file; kvfs_engine waits for it, and unicode.cpp's #include
# of the file makes that object rebuild when the tables change.
add_custom_target(kvfs_unicode_tables DEPENDS "${KVFS_UNICODE_TABLES}")
add_dependencies(kvfs_engine kvfs_unicode_tables)
