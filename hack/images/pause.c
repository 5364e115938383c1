/*
 * The tests' pause image: the sandbox ("infra") container of every pod on the test node.
 *
 * It holds the pod's namespaces and does nothing else: it sleeps until SIGTERM or SIGINT
 * (then exits 0) and reaps any child that is reparented to it (it is PID 1 of the pod when the
 * pod shares its process namespace). Built with `gcc -static` into an image of one file
 * (harness/images.py), the same job as Kubernetes' own pause.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) {
    (void)signo;
    _exit(0);
}

static void reap(int signo) {
    (void)signo;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int on(int signo, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = signo == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("configpin-test pause 1");
        return 0;
    }
    if (on(SIGINT, stop) < 0 || on(SIGTERM, stop) < 0 || on(SIGCHLD, reap) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not PID 1\n", stderr);
    }
    for (;;) {
        pause();
    }
}
