// Which class paths (GLOBAL / STACK_GLOBAL module + name) a checkpoint pickle may name. torch.load
// imports every one of them; a path that cannot be imported makes torch.load fail, and one that a
// flipped byte turned into another valid-looking name would otherwise be carried into the output
// (ucpkit keeps unknown classes as opaque objects). By default a pickle may name:
//  * modules under Python's standard library (and the Python 2 names pickle maps onto it), `__main__`;
//  * modules under the packages whose objects training checkpoints hold: torch, numpy, deepspeed,
//    megatron, apex, transformer_engine, transformers, accelerate, omegaconf, nemo, lightning,
//    lightning_fabric, pytorch_lightning, fairscale, peft;
//  * for builtins / __builtin__, collections, _codecs, copyreg / copy_reg and argparse, only names
//    those modules have (their namespace is fixed by the language).
// Tools add modules with --trust-module (torch 2.6's weights_only loader has the same kind of
// allow-list, extended by torch.serialization.add_safe_globals).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace ucpkit::pickle {

// Accept classes of these modules and their submodules too ("*": any module, no name checks).
// Process-wide; call before reading (not synchronized with readers).
void trust_modules(const std::vector<std::string>& modules);
// Back to the default list (tests).
void reset_trusted_modules();

// Empty when `module`.`name` may appear in a checkpoint pickle; otherwise why not (one phrase that
// names the module and the option).
std::string class_path_problem(std::string_view module, std::string_view name);

}  // namespace ucpkit::pickle
