// lib/io/pickle/opcodes.h: every opcode has the byte Python's own pickle module gives its name, and
// every opcode Python defines is in the enum (checked by /usr/bin/python3's pickle, not a copied table).
#include <gtest/gtest.h>

#include <fstream>
#include <utility>
#include <vector>

#include "io/pickle/opcodes.h"
#include "support/process.h"

namespace opcodes_test {

using ucpkit::pickle::Op;
using ucpkit::pickle::op_byte;

TEST(PickleOpcodes, AreTheBytesPythonsPickleModuleNames) {
#define OP(name) {#name, op_byte(Op::name)}
  const std::vector<std::pair<const char*, int>> ops = {
      OP(MARK), OP(STOP), OP(POP), OP(POP_MARK), OP(DUP), OP(FLOAT), OP(INT), OP(BININT), OP(BININT1), OP(LONG),
      OP(BININT2), OP(NONE), OP(PERSID), OP(BINPERSID), OP(REDUCE), OP(STRING), OP(BINSTRING), OP(SHORT_BINSTRING),
      OP(UNICODE), OP(BINUNICODE), OP(APPEND), OP(BUILD), OP(GLOBAL), OP(DICT), OP(EMPTY_DICT), OP(APPENDS), OP(GET),
      OP(BINGET), OP(INST), OP(LONG_BINGET), OP(LIST), OP(EMPTY_LIST), OP(OBJ), OP(PUT), OP(BINPUT), OP(LONG_BINPUT),
      OP(SETITEM), OP(TUPLE), OP(EMPTY_TUPLE), OP(SETITEMS), OP(BINFLOAT), OP(PROTO), OP(NEWOBJ), OP(EXT1), OP(EXT2),
      OP(EXT4), OP(TUPLE1), OP(TUPLE2), OP(TUPLE3), OP(NEWTRUE), OP(NEWFALSE), OP(LONG1), OP(LONG4), OP(BINBYTES),
      OP(SHORT_BINBYTES), OP(SHORT_BINUNICODE), OP(BINUNICODE8), OP(BINBYTES8), OP(EMPTY_SET), OP(ADDITEMS),
      OP(FROZENSET), OP(NEWOBJ_EX), OP(STACK_GLOBAL), OP(MEMOIZE), OP(FRAME), OP(BYTEARRAY8), OP(NEXT_BUFFER),
      OP(READONLY_BUFFER)};
#undef OP
  const std::string dir = ucpkit::testing::scratch_dir("pickle_opcodes");
  {
    std::ofstream out(dir + "/ops.txt");
    for (const auto& [name, byte] : ops) out << name << " " << byte << "\n";
  }
  // pickletools.opcodes lists every opcode Python knows; pickle.<NAME> is its byte.
  const std::string check = R"(
import pickle, pickletools, sys
ours = dict((n, int(b)) for n, b in (l.split() for l in open(sys.argv[1])))
bad = [n for n, b in ours.items() if getattr(pickle, n, None) != bytes([b])]
missing = [o.name for o in pickletools.opcodes if o.name not in ours]
print('wrong:', bad, 'missing:', missing)
sys.exit(1 if bad or missing else 0)
)";
  {
    std::ofstream(dir + "/check.py") << check;
  }
  std::string output;
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + dir + "/check.py " + dir + "/ops.txt", &output), 0)
      << output;
}

}  // namespace opcodes_test
