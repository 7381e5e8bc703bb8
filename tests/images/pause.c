/* The pod sandbox's process for the test cluster's nodes (scripts/images.py builds it into the
 * image localhost/ipkeep/pause): it holds the pod's namespaces open and does nothing else.
 * It waits for signals, reaps any child that is re-parented to it (it is PID 1 of the pod when
 * the pod shares its process namespace), and exits 0 on SIGTERM or SIGINT. Built with
 * `gcc -static -Os -s`, so the image needs no C library. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&on_stop.sa_mask);
  sigemptyset(&on_child.sa_mask);
  if (sigaction(SIGTERM, &on_stop, NULL) != 0 || sigaction(SIGINT, &on_stop, NULL) != 0 ||
      sigaction(SIGCHLD, &on_child, NULL) != 0) {
    return 1;
  }
  for (;;) {
    pause();
  }
}
