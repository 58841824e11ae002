# libcurl, for MLflow tracking over its REST API: optional like the image decoders. Found, it is
# linked to `target` with DETTRIAL_HAS_CURL; without it dettrial still builds, says so here, and a
# run given an MLflow server warns that tracking is off.
function(dettrial_find_curl target)
  find_package(CURL QUIET)
  if(TARGET CURL::libcurl)
    target_link_libraries(${target} INTERFACE CURL::libcurl)
    target_compile_definitions(${target} INTERFACE DETTRIAL_HAS_CURL)
    message(STATUS "dettrial: MLflow tracking on (libcurl ${CURL_VERSION_STRING})")
    set(DETTRIAL_TRACKS_MLFLOW TRUE PARENT_SCOPE)
  else()
    message(STATUS "dettrial: libcurl was not found: MLflow tracking is left out (Debian: libcurl4-openssl-dev)")
  endif()
endfunction()
