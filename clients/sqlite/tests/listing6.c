/* listing6 EXT DB THREADS N — the porting thesis's Listing 6 in C: each of
 * THREADS threads stores N messages, each as one SQLite row plus one plain
 * file (DIR/m<id>) in one application transaction, retried on conflict.
 * Exit 0 when every message was stored; the caller checks rows == files. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "txfs.h"

static const char *db_path;
static char dir[4096];
static int n_per_thread;

static int store(sqlite3 *db, int id)
{
    char sql[128], file[4200];
    snprintf(sql, sizeof sql, "INSERT INTO msg(id, body) VALUES (%d, 'message %d')", id, id);
    snprintf(file, sizeof file, "%s/m%d", dir, id);
    for (int attempt = 0;; attempt++) {
        if (attempt > 1000) {
            fprintf(stderr, "id %d: too many retries\n", id);
            return -1;
        }
        if (attempt)
            usleep((unsigned)(rand() % 2000));
        if (txfs_begin(dir, 0) != 0) {
            perror("txfs_begin");
            return -1;
        }
        int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if ((rc & 0xff) == SQLITE_BUSY) { /* lost a conflict: all of it again */
            txfs_abort();
            continue;
        }
        if (rc != SQLITE_OK) {
            fprintf(stderr, "id %d: %s\n", id, sqlite3_errmsg(db));
            txfs_abort();
            return -1;
        }
        int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, sql, strlen(sql)) < 0 || close(fd) != 0) {
            if (errno == TXFS_ECONFLICT) {
                txfs_abort();
                continue;
            }
            perror(file);
            txfs_abort();
            return -1;
        }
        if (txfs_commit(0) == 0)
            return 0;
        if (errno != TXFS_ECONFLICT) {
            perror("txfs_commit");
            return -1;
        }
        txfs_abort(); /* EINVAL if the failed commit already ended it */
    }
}

static void *worker(void *arg)
{
    int t = (int)(long)arg;
    sqlite3 *db;
    char uri[4200];
    snprintf(uri, sizeof uri, "file:%s?vfs=txfs", db_path);
    if (sqlite3_open_v2(uri, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
        fprintf(stderr, "open %s: %s\n", uri, sqlite3_errmsg(db));
        return (void *)1;
    }
    sqlite3_busy_timeout(db, 2000);
    long bad = 0;
    for (int i = 0; i < n_per_thread && !bad; i++)
        bad = store(db, t * 1000 + i) != 0;
    sqlite3_close(db);
    return (void *)bad;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: listing6 EXT DB THREADS N\n");
        return 2;
    }
    db_path = argv[2];
    int threads = atoi(argv[3]);
    n_per_thread = atoi(argv[4]);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", db_path);
    snprintf(dir, sizeof dir, "%s", dirname(tmp));

    /* Register the VFS: load the extension through any connection. */
    sqlite3 *boot;
    char *err = NULL;
    sqlite3_open(":memory:", &boot);
    sqlite3_enable_load_extension(boot, 1);
    if (sqlite3_load_extension(boot, argv[1], NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "load %s: %s\n", argv[1], err);
        return 1;
    }
    sqlite3_close(boot);

    sqlite3 *db;
    char uri[4200];
    snprintf(uri, sizeof uri, "file:%s?vfs=txfs", db_path);
    if (sqlite3_open_v2(uri, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "CREATE TABLE msg(id INTEGER PRIMARY KEY, body)", NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "setup: %s\n", err ? err : sqlite3_errmsg(db));
        return 1;
    }
    sqlite3_close(db);

    pthread_t th[64];
    if (threads < 1 || threads > 64)
        return 2;
    for (int t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, worker, (void *)(long)t);
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        void *r;
        pthread_join(th[t], &r);
        failed |= r != NULL;
    }
    return failed;
}
