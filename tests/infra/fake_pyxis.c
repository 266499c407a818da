/*
 * A stand-in for the pyxis SPANK plugin, so job scripts written for pyxis clusters
 * (`srun --container-image=... --container-mounts=... --container-workdir=...`) run on the
 * plain Slurm test cluster.
 *
 * No container is created. In each task it:
 *   - checks that an image given as a path is a squashfs file (magic "hsqs"), failing the task
 *     with pyxis' own message otherwise, so a missing or half-written .sqsh fails the job;
 *   - bind-mounts --container-mounts SRC[:DST[:FLAGS]],... in a private mount namespace;
 *   - changes to --container-workdir;
 *   - exports FAKE_PYXIS_IMAGE / _MOUNTS / _WORKDIR / _NAME so tests can see what was asked.
 * Image references that are not paths (docker refs) are accepted as they are.
 *
 * Build: gcc -shared -fPIC -O2 -o fake_pyxis.so fake_pyxis.c   (needs libslurm-dev)
 * Enable: "required /path/fake_pyxis.so" in plugstack.conf ("optional" would ignore failures).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(fake_pyxis, 1);

/* values of the options that take an argument; boolean pyxis flags are accepted and ignored */
static struct {
    char *image, *mounts, *workdir, *name, *save, *env;
} opt;
static int setup_failed; /* set while privileged, reported in task_init, which can fail the task */

enum { OPT_FLAG, OPT_IMAGE, OPT_MOUNTS, OPT_WORKDIR, OPT_NAME, OPT_SAVE, OPT_ENV };

static int set_option(int which, const char *arg, int remote)
{
    char **slot;
    (void)remote;
    switch (which) {
    case OPT_IMAGE: slot = &opt.image; break;
    case OPT_MOUNTS: slot = &opt.mounts; break;
    case OPT_WORKDIR: slot = &opt.workdir; break;
    case OPT_NAME: slot = &opt.name; break;
    case OPT_SAVE: slot = &opt.save; break;
    case OPT_ENV: slot = &opt.env; break;
    default: return 0;
    }
    free(*slot);
    *slot = arg ? strdup(arg) : NULL;
    return 0;
}

#define VALUE(n, arg, v) {(n), (arg), "[fake pyxis] " n, 1, (v), set_option}
#define FLAG(n) {(n), NULL, "[fake pyxis] " n, 0, OPT_FLAG, set_option}
static struct spank_option options[] = {
    VALUE("container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", OPT_IMAGE),
    VALUE("container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", OPT_MOUNTS),
    VALUE("container-workdir", "PATH", OPT_WORKDIR),
    VALUE("container-name", "NAME", OPT_NAME),
    VALUE("container-save", "PATH", OPT_SAVE),
    VALUE("container-env", "NAME[,NAME...]", OPT_ENV),
    FLAG("container-mount-home"),
    FLAG("no-container-mount-home"),
    FLAG("container-remap-root"),
    FLAG("no-container-remap-root"),
    FLAG("container-entrypoint"),
    FLAG("no-container-entrypoint"),
    FLAG("container-writable"),
    FLAG("container-readonly"),
    SPANK_OPTIONS_TABLE_END,
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    for (struct spank_option *o = options; o->name; o++)
        if (spank_option_register(sp, o) != ESPANK_SUCCESS)
            slurm_error("fake_pyxis: cannot register --%s", o->name);
    return 0;
}

static int is_squashfs(const char *path)
{
    char magic[4];
    FILE *f = fopen(path, "rb");
    int ok = f && fread(magic, 1, sizeof magic, f) == sizeof magic && memcmp(magic, "hsqs", 4) == 0;
    if (f)
        fclose(f);
    return ok;
}

static void mkdir_p(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

/* one "SRC[:DST[:FLAGS]]" entry; DST defaults to SRC like pyxis */
static int bind_one(char *entry)
{
    char *src = entry, *dst = strchr(entry, ':');
    struct stat st;
    if (dst) {
        *dst++ = '\0';
        char *flags = strchr(dst, ':');
        if (flags)
            *flags = '\0';
    } else {
        dst = src;
    }
    if (stat(src, &st) != 0) {
        slurm_error("pyxis: mount source %s: %s", src, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode))
        mkdir_p(dst);
    if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0) {
        slurm_error("pyxis: bind mount %s -> %s: %s", src, dst, strerror(errno));
        return -1;
    }
    return 0;
}

/* runs as root in each task, before privileges are dropped */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!spank_remote(sp) || !opt.image)
        return 0;
    if ((opt.image[0] == '/' || opt.image[0] == '.') && !is_squashfs(opt.image)) {
        slurm_error("pyxis: failed to import docker image: %s is not a squashfs file", opt.image);
        setup_failed = 1;
        return -1;
    }
    if (!opt.mounts)
        return 0;
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        slurm_error("pyxis: private mount namespace: %s", strerror(errno));
        setup_failed = 1;
        return -1;
    }
    char *list = strdup(opt.mounts), *save = NULL;
    for (char *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        if (bind_one(m) != 0) {
            setup_failed = 1;
            break;
        }
    }
    free(list);
    return setup_failed ? -1 : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!spank_remote(sp) || !opt.image)
        return 0;
    if (setup_failed)
        return -1;
    spank_setenv(sp, "FAKE_PYXIS_IMAGE", opt.image, 1);
    if (opt.mounts)
        spank_setenv(sp, "FAKE_PYXIS_MOUNTS", opt.mounts, 1);
    if (opt.name)
        spank_setenv(sp, "FAKE_PYXIS_NAME", opt.name, 1);
    if (opt.workdir) {
        spank_setenv(sp, "FAKE_PYXIS_WORKDIR", opt.workdir, 1);
        if (chdir(opt.workdir) != 0) {
            slurm_error("pyxis: container workdir %s: %s", opt.workdir, strerror(errno));
            return -1;
        }
    }
    return 0;
}
