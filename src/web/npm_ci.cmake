# Installs the dashboard's pinned packages (web/package.json, exactly as
# web/package-lock.json says) into the build folder. Run by the build
# (src/web/CMakeLists.txt) when the lock file changes:
#   cmake -DNPM=npm -DSOURCE_DIR=web -DWORK_DIR=dir -DSTAMP=file -P npm_ci.cmake
# Fails the build, saying why, when npm cannot install them.
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(_file package.json package-lock.json)
  file(COPY_FILE "${SOURCE_DIR}/${_file}" "${WORK_DIR}/${_file}" ONLY_IF_DIFFERENT)
endforeach()
# --ignore-scripts: no package runs code at install time (esbuild finds its
# platform's binary, an optional dependency, when it starts).
execute_process(COMMAND "${NPM}" ci --no-audit --no-fund --ignore-scripts
                WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE _result)
if(NOT _result EQUAL 0)
  file(REMOVE "${STAMP}")
  message(FATAL_ERROR
    "`npm ci` failed (${_result}) in ${WORK_DIR}.\n"
    "The admin listener's dashboard (web/) is bundled at build time from the npm packages "
    "pinned in web/package-lock.json: the build needs node (18 or newer) and npm "
    "(`apt-get install nodejs npm`, or scripts/deps.sh) and the npm registry to be "
    "reachable (or those packages in npm's cache).")
endif()
file(TOUCH "${STAMP}")
