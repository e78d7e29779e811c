/* The pod sandbox's process for the test cluster's real node (no registry here
 * to pull registry.k8s.io/pause from). PID 1 of the pod: it holds the pod's
 * namespaces open, reaps orphans and exits on SIGINT/SIGTERM.
 * Built by tests/harness/images.py with `gcc -static -O2`. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = quit};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &stop, NULL);
  sigaction(SIGTERM, &stop, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
