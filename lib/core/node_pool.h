// Recycled memory for small nodes made and dropped by the million (pickle values: a 100,000-tensor DCP `.metadata`
// decodes to about 25 per tensor, each dropped once converted). glibc keeps 7 freed chunks per size in its per-thread
// cache and sorts the others into its bins, then consolidates them: with values of about 300 bytes that was about a
// third of a 100,000-tensor rewrite (GLIBC_TUNABLES tcache_count=65535 took it from 14.0 to 10.2 s, and a process
// cannot set that count itself). A per-thread list of freed blocks of one size serves them instead.
#pragma once
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace ucpkit {

// Blocks of `Size` bytes (operator new's alignment): take() reuses one this thread freed, else allocates; give()
// keeps up to kKeep of them for reuse (about 20 MB of values per thread at most), frees the others. A block may be
// given back on another thread than the one that took it.
template <size_t Size>
class FreeBlocks {
 public:
  static constexpr size_t kKeep = size_t{1} << 16;
  static void* take() {
    List& l = list();
    if (!l.head) return ::operator new(Size);
    Node* n = l.head;
    l.head = n->next;
    --l.count;
    return n;
  }
  static void give(void* p) {
    List& l = list();
    if (l.count >= kKeep) return ::operator delete(p);
    auto* n = static_cast<Node*>(p);
    n->next = l.head;
    l.head = n;
    ++l.count;
  }
  static size_t kept() { return list().count; }

 private:
  struct Node {
    Node* next;
  };
  static_assert(Size >= sizeof(Node));
  struct List {
    Node* head = nullptr;
    size_t count = 0;
    ~List() {
      while (head) ::operator delete(std::exchange(head, head->next));
    }
  };
  static List& list() {
    thread_local List l;
    return l;
  }
};

// An allocator for std::allocate_shared of one node at a time through FreeBlocks (arrays go to operator new).
template <class T>
struct NodeAllocator {
  using value_type = T;
  NodeAllocator() = default;
  template <class U>
  NodeAllocator(const NodeAllocator<U>&) {}
  T* allocate(size_t n) {
    if (n != 1 || alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) return std::allocator<T>().allocate(n);
    return static_cast<T*>(FreeBlocks<sizeof(T)>::take());
  }
  void deallocate(T* p, size_t n) {
    if (n != 1 || alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__) return std::allocator<T>().deallocate(p, n);
    FreeBlocks<sizeof(T)>::give(p);
  }
  template <class U>
  bool operator==(const NodeAllocator<U>&) const {
    return true;
  }
};

// std::make_shared<T>(args...) with the block from FreeBlocks.
template <class T, class... Args>
std::shared_ptr<T> make_node(Args&&... args) {
  return std::allocate_shared<T>(NodeAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace ucpkit
