# server/embed.cmake: writes the file IN as a C byte array (ddld_dashboard_html, with a
# terminating zero not counted in ddld_dashboard_html_len) to OUT. cmake -P, no other tool.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "// Generated from server/dashboard.html by server/embed.cmake: do not edit.\n"
     "#include <stddef.h>\n"
     "const unsigned char ddld_dashboard_html[] = {\n${bytes}0};\n"
     "const size_t ddld_dashboard_html_len = ${len};\n")
