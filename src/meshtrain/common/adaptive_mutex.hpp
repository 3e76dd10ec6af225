// adaptive_mutex.hpp — AdaptiveMutex: a mutex that spins briefly on contention before it sleeps.
//
// std::mutex (a glibc "normal" mutex) puts a thread that finds it held to sleep in the kernel at once, and the holder
// pays a second system call to wake it. For locks held for a few hundred nanoseconds by threads on different cores
// (the host loader's hand-over between its workers and the device threads) both calls cost more than the wait they
// replace, the more so in a virtual machine. glibc's adaptive mutex first spins for a bounded number of tries.
// It meets the standard's Lockable requirements: use it with std::unique_lock and std::condition_variable_any.
#pragma once

#include <pthread.h>

namespace meshtrain {

class AdaptiveMutex {
 public:
  AdaptiveMutex() {
    pthread_mutexattr_t attributes;
    pthread_mutexattr_init(&attributes);
    pthread_mutexattr_settype(&attributes, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&mutex_, &attributes);
    pthread_mutexattr_destroy(&attributes);
  }
  ~AdaptiveMutex() { pthread_mutex_destroy(&mutex_); }
  AdaptiveMutex(const AdaptiveMutex&) = delete;
  AdaptiveMutex& operator=(const AdaptiveMutex&) = delete;

  void lock() { pthread_mutex_lock(&mutex_); }
  bool try_lock() { return pthread_mutex_trylock(&mutex_) == 0; }
  void unlock() { pthread_mutex_unlock(&mutex_); }

 private:
  pthread_mutex_t mutex_;
};

}  // namespace meshtrain
