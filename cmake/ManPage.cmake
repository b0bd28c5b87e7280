# A man page (roff, section 1) from a tool's --help and --version output:
#   cmake -DTOOL=<binary> -DNAME=<tool> -DVERSION=<x.y.z> -DOUTPUT=<file.1> -P ManPage.cmake
# The help text is kept as written (a no-fill block); roff's special characters are escaped.
execute_process(COMMAND "${TOOL}" --help OUTPUT_VARIABLE help RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME} --help failed (${rc}): ${err}")
endif()
execute_process(COMMAND "${TOOL}" --version OUTPUT_VARIABLE version RESULT_VARIABLE rc)
function(roff_escape var text)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REPLACE "-" "\\-" text "${text}")
  # A line starting with . or ' would be a roff request.
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${var} "${text}" PARENT_SCOPE)
endfunction()
# The first line of --help (CLI11 prints the app description first) is the page's short description.
string(REGEX MATCH "^[^\n]*" summary "${help}")
roff_escape(summary "${summary}")
roff_escape(help "${help}")
roff_escape(version "${version}")
string(TOUPPER "${NAME}" upper)
file(WRITE "${OUTPUT}.tmp" ".TH ${upper} 1 \"\" \"ucpkit ${VERSION}\" \"User Commands\"
.SH NAME
${NAME} \\- ${summary}
.SH DESCRIPTION
.nf
${help}
.fi
.SH VERSION
.nf
${version}
.fi
.SH EXIT STATUS
0 success, 1 runtime failure (I/O, corrupt or inconsistent input), 2 usage error.
.SH SEE ALSO
The ucpkit documentation in share/doc/ucpkit under the install prefix (/usr/share/doc/ucpkit from the Debian package); commands.md is the command-line contract.
")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
