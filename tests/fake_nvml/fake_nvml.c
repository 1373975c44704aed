/*
 * A fake libnvidia-ml.so.1 for tests. It implements a subset of NVML against
 * the real nvml.h and answers from a JSON scenario named by the environment
 * variable FAKE_NVML_SCENARIO. The scenario format is in README.md.
 *
 * Locking: `mu` guards the scenario and all other shared state. Every
 * per-device call copies its GPU under `mu` in enter() and works on the copy.
 * Calls that hang or wait sleep without holding `mu`. `init_mu` serializes
 * nvmlInit (scenario loading) only.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* declare the unversioned names too */
#include <nvml.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_ITEMS 64 /* processes, xids and unsupported fields per GPU */
#define MAX_SETS 256
#define MAX_FILE (4 << 20)
#define SUPPORTED_EVENTS                                                        \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |         \
     nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

/* ---- function table: names usable in "errors" and "hang" ---- */

#define DEVICE_FNS(X)                                                           \
    X(nvmlDeviceGetHandleByIndex) X(nvmlDeviceGetHandleByIndex_v2)              \
    X(nvmlDeviceGetHandleByPciBusId) X(nvmlDeviceGetHandleByPciBusId_v2)        \
    X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetIndex) X(nvmlDeviceGetMinorNumber) \
    X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetSerial)            \
    X(nvmlDeviceGetVbiosVersion) X(nvmlDeviceGetPciInfo) X(nvmlDeviceGetPciInfo_v2) \
    X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2) \
    X(nvmlDeviceGetEccMode) X(nvmlDeviceGetTotalEccErrors) X(nvmlDeviceGetRemappedRows) \
    X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPages_v2)                \
    X(nvmlDeviceGetRetiredPagesPendingStatus) X(nvmlDeviceGetCurrentClocksEventReasons) \
    X(nvmlDeviceGetCurrentClocksThrottleReasons) X(nvmlDeviceGetSupportedClocksEventReasons) \
    X(nvmlDeviceGetSupportedClocksThrottleReasons) X(nvmlDeviceGetViolationStatus) \
    X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkGeneration) \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkWidth)  \
    X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetPcieReplayCounter)          \
    X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkErrorCounter)              \
    X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetTemperature)                    \
    X(nvmlDeviceGetTemperatureThreshold) X(nvmlDeviceGetPowerUsage)             \
    X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetPowerManagementLimit)     \
    X(nvmlDeviceGetPowerManagementDefaultLimit) X(nvmlDeviceGetPersistenceMode) \
    X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3) X(nvmlDeviceGetSupportedEventTypes) \
    X(nvmlDeviceRegisterEvents) X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetArchitecture) \
    X(nvmlDeviceGetCudaComputeCapability) X(nvmlDeviceGetPerformanceState)      \
    X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo)                     \
    X(nvmlDeviceGetGpuFabricInfo) X(nvmlDeviceGetGpuFabricInfoV)
#define GLOBAL_FNS(X)                                                           \
    X(nvmlSystemGetDriverVersion) X(nvmlSystemGetNVMLVersion)                   \
    X(nvmlSystemGetCudaDriverVersion) X(nvmlSystemGetCudaDriverVersion_v2)      \
    X(nvmlDeviceGetCount) X(nvmlDeviceGetCount_v2) X(nvmlEventSetCreate)        \
    X(nvmlEventSetWait) X(nvmlEventSetWait_v2) X(nvmlEventSetFree)
#define FN_ENUM(n) F_##n,
#define FN_NAME(n) #n,
enum { DEVICE_FNS(FN_ENUM) N_DEV_FNS, F_LAST_DEV = N_DEV_FNS - 1, GLOBAL_FNS(FN_ENUM) N_FNS };
static const char *const fn_names[] = {DEVICE_FNS(FN_NAME) GLOBAL_FNS(FN_NAME)};
_Static_assert(sizeof fn_names / sizeof fn_names[0] == N_FNS, "function table out of sync");

/* ---- return codes ---- */

#define RC(n, text) {NVML_ERROR_##n, #n, text},
static const struct { nvmlReturn_t rc; const char *name, *text; } codes[] = {
    {NVML_SUCCESS, "SUCCESS", "Success"},
    RC(UNINITIALIZED, "Uninitialized") RC(INVALID_ARGUMENT, "Invalid Argument")
    RC(NOT_SUPPORTED, "Not Supported") RC(NO_PERMISSION, "Insufficient Permissions")
    RC(ALREADY_INITIALIZED, "Already Initialized") RC(NOT_FOUND, "Not Found")
    RC(INSUFFICIENT_SIZE, "Insufficient Size") RC(INSUFFICIENT_POWER, "Insufficient External Power")
    RC(DRIVER_NOT_LOADED, "Driver Not Loaded") RC(TIMEOUT, "Timeout")
    RC(IRQ_ISSUE, "Interrupt request issue") RC(LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
    RC(FUNCTION_NOT_FOUND, "Function Not Found") RC(CORRUPTED_INFOROM, "Corrupted infoROM")
    RC(GPU_IS_LOST, "GPU is lost") RC(RESET_REQUIRED, "GPU requires restart")
    RC(OPERATING_SYSTEM, "The operating system has blocked the request.")
    RC(LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch.")
    RC(IN_USE, "In use by another client") RC(MEMORY, "Insufficient Memory")
    RC(NO_DATA, "No data")
    RC(VGPU_ECC_NOT_SUPPORTED, "The requested vgpu operation is not available on target device, because ECC is enabled")
    RC(INSUFFICIENT_RESOURCES, "Ran out of critical resources, other than memory")
    RC(FREQ_NOT_SUPPORTED, "The requested frequency is not supported")
    RC(ARGUMENT_VERSION_MISMATCH, "The provided version is invalid/unsupported")
    RC(DEPRECATED, "The requested functionality has been deprecated")
    RC(NOT_READY, "The system is not ready for the request") RC(GPU_NOT_FOUND, "No GPUs were found")
    RC(INVALID_STATE, "Resource not in correct state to perform requested operation")
    RC(RESET_TYPE_NOT_SUPPORTED, "Reset not supported for given device/parameters")
    RC(UNKNOWN, "Unknown Error")
};
#define N_CODES (sizeof codes / sizeof codes[0])

/* ---- scenario ---- */

typedef struct { double base, per_s; } ctr_t; /* value = base + per_s * (now - t0) */
enum { ECC_VC, ECC_VU, ECC_AC, ECC_AU, N_ECC };
enum { THR_SW_POWER, THR_SYNC_BOOST, THR_SW_THERMAL, THR_HW_THERMAL, THR_HW_BRAKE, N_THR };
enum { NVL_CRC_FLIT, NVL_CRC_DATA, NVL_REPLAY, NVL_RECOVERY, NVL_ECC_DATA, N_NVL };
enum { PCIE_GEN, PCIE_MAX_GEN, PCIE_GPU_MAX_GEN, PCIE_WIDTH, PCIE_MAX_WIDTH, N_PCIE };
static const char *const ecc_keys[N_ECC] = {"volatile_corrected", "volatile_uncorrected",
                                            "aggregate_corrected", "aggregate_uncorrected"};
static const char *const thr_keys[N_THR] = {"sw_power_cap", "sync_boost", "sw_thermal",
                                            "hw_thermal", "hw_power_brake"};
static const char *const nvl_keys[N_NVL] = {"crc_flit", "crc_data", "replay", "recovery",
                                            "ecc_data"};
static const char *const pcie_keys[N_PCIE] = {"gen", "max_gen", "gpu_max_gen", "width",
                                              "max_width"};
/* In nvmlTemperatureThresholds_t order. */
static const char *const thresh_keys[4] = {"shutdown", "slowdown", "mem_max", "gpu_max"};
static const char *const util_keys[2] = {"gpu", "memory"};

typedef struct {
    int slot, index, visible; /* index is -1 for an invisible GPU */
    double t;                 /* seconds since t0; set by enter() */
    unsigned pci[4];          /* domain, bus, device, function */
    unsigned pci_device_id, pci_subsystem_id, minor;
    char name[NVML_DEVICE_NAME_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE], vbios[NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE];
    unsigned long long mem_total, mem_used, clk_reasons, clk_supported;
    unsigned ecc_mode[2], remap[4], pages[2], pages_pending;
    ctr_t ecc[N_ECC], thr[N_THR], nvl[N_NVL], pcie_replay;
    unsigned pcie[N_PCIE], nvl_links, thresh[4], util[2];
    unsigned long long nvl_down; /* bit per inactive link */
    long long temp; /* int for nvmlDeviceGetTemperatureV, unsigned for the old call */
    int cc[2];
    char bus_id_reported[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]; /* "": derived from pci */
    unsigned power_mw, power_limit_mw, default_power_limit_mw, persistence, recovery_action;
    unsigned arch, pstate, sm_clock, max_sm_clock, mem_clock;
    /* nvmlGpuFabricInfo_t / nvmlGpuFabricInfoV_t; fab_state < 0: derived from nvl_links */
    int fab_state;
    nvmlReturn_t fab_status;
    unsigned fab_clique, fab_health_mask, fab_health_summary;
    unsigned char fab_cluster[NVML_GPU_FABRIC_UUID_LEN];
    unsigned nproc, nxid, nunsup, unsup[MAX_ITEMS];
    unsigned nfielderr, fielderr_id[MAX_ITEMS];
    nvmlReturn_t fielderr_rc[MAX_ITEMS];
    struct { unsigned pid; unsigned long long mem; double after, until; } proc[MAX_ITEMS];
    struct { unsigned long long xid; double after; } xid[MAX_ITEMS];
    double lost_after;           /* < 0: never */
    int from_registration;       /* "timed_from": "registration" */
    double registered_at;        /* seconds since t0 of its first XID registration; < 0: none */
    nvmlReturn_t err[N_DEV_FNS]; /* NVML_SUCCESS: no injected error */
    double hang[N_DEV_FNS];      /* < 0: no hang */
    double hang_until[N_DEV_FNS]; /* < 0: for ever; else calls from then on answer */
} gpu_t;

typedef struct {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_version, ngpus;
    nvmlReturn_t init_error;
    double init_hang_s, hang_s, hang[N_FNS], hang_until[N_FNS];
    long long device_count; /* < 0: the number of visible GPUs */
    nvmlReturn_t err[N_FNS]; /* injected errors of system/global functions */
    gpu_t gpus[MAX_GPUS];
} scen_t;

struct nvmlDevice_st { char unused; };
struct nvmlEventSet_st {
    int used;
    unsigned gen;                                     /* generation `delivered` is for */
    unsigned long long reg[MAX_GPUS], delivered[MAX_GPUS]; /* per GPU slot */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER, init_mu = PTHREAD_MUTEX_INITIALIZER;
static scen_t S;
static unsigned refcount, generation;
static double t0;
static int loaded;
static char loaded_path[4096];
static long long loaded_mtime;
static struct nvmlDevice_st handles[MAX_GPUS];
static struct nvmlEventSet_st sets[MAX_SETS];

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
static long long wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}
static unsigned long long cval(ctr_t c, double t) {
    double v = c.base + c.per_s * t;
    if (!(v > 0)) return 0;
    return v >= 18446744073709551616.0 ? ULLONG_MAX : (unsigned long long)v;
}

/* ---- JSON DOM ---- */

enum jt { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
    enum jt t;
    size_t pos, kpos; /* byte offsets of the value and of its key */
    double num;       /* number, or 0/1 for a bool */
    const char *s, *key;
    struct jv *kid, *next; /* first element or member; next sibling */
} jv;
typedef struct {
    const char *path, *p;
    size_t n, i, used, cap;
    char *buf, *arena;
    jmp_buf jb;
} pctx;

__attribute__((noreturn, format(printf, 3, 4))) static void fail(pctx *c, size_t pos,
                                                                  const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    for (char *q = what; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f) *q = '?'; /* keep it to one line */
    fprintf(stderr, "fake-nvml: %s: %s at byte %zu\n", c->path, what, pos);
    longjmp(c->jb, 1);
}
static void *alloc(pctx *c, size_t n, size_t align) {
    size_t at = (c->used + align - 1) & ~(align - 1);
    if (at + n > c->cap) fail(c, c->i, "document too complex");
    c->used = at + n;
    return c->arena + at;
}
static void skip_ws(pctx *c) {
    while (c->i < c->n && strchr(" \t\r\n", c->p[c->i]) && c->p[c->i]) c->i++;
}
static int peek(pctx *c) { skip_ws(c); return c->i < c->n ? (unsigned char)c->p[c->i] : -1; }
static void expect(pctx *c, char ch) {
    if (peek(c) != ch) fail(c, c->i, "expected '%c'", ch);
    c->i++;
}
static const char *parse_string(pctx *c) {
    size_t start = c->i++, j = c->i;
    while (j < c->n && c->p[j] != '"') j += c->p[j] == '\\' ? 2 : 1;
    char *out = alloc(c, j - c->i + 1, 1), *o = out;
    for (;;) {
        if (c->i >= c->n) fail(c, start, "unterminated string");
        unsigned char ch = (unsigned char)c->p[c->i++];
        if (ch == '"') break;
        if (ch < 0x20) fail(c, c->i - 1, "control character in string");
        if (ch != '\\') { *o++ = (char)ch; continue; }
        ch = c->i < c->n ? (unsigned char)c->p[c->i++] : 0;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *e = ch ? strchr(from, ch) : NULL;
        if (e) { *o++ = to[e - from]; continue; }
        if (ch != 'u') fail(c, c->i - 2, "bad escape in string");
        unsigned u = 0;
        for (int k = 0; k < 4; k++, c->i++) {
            if (c->i >= c->n || !isxdigit((unsigned char)c->p[c->i]))
                fail(c, c->i, "bad \\u escape");
            char hx[2] = {c->p[c->i], 0};
            u = u * 16 + (unsigned)strtoul(hx, NULL, 16);
        }
        /* \u0080-\u00ff stand for the single bytes 0x80-0xff, so a scenario can give
           a GPU a name or UUID that is not UTF-8 (what a corrupted InfoROM may hold). */
        if (u == 0 || u > 0xff) fail(c, c->i - 6, "only \\u0001-\\u00ff escapes are supported");
        *o++ = (char)u;
    }
    *o = 0;
    return out;
}
static double parse_number(pctx *c) {
    size_t s = c->i;
    const char *p = c->p;
    if (p[c->i] == '-') c->i++;
    if (p[c->i] == '0') c->i++;
    else if (p[c->i] >= '1' && p[c->i] <= '9') while (isdigit((unsigned char)p[c->i])) c->i++;
    else fail(c, s, "bad number");
    if (p[c->i] == '.') {
        if (!isdigit((unsigned char)p[++c->i])) fail(c, s, "bad number");
        while (isdigit((unsigned char)p[c->i])) c->i++;
    }
    if (p[c->i] == 'e' || p[c->i] == 'E') {
        c->i++;
        if (p[c->i] == '+' || p[c->i] == '-') c->i++;
        if (!isdigit((unsigned char)p[c->i])) fail(c, s, "bad number");
        while (isdigit((unsigned char)p[c->i])) c->i++;
    }
    char tmp[64];
    if (c->i - s >= sizeof tmp) fail(c, s, "number too long");
    memcpy(tmp, p + s, c->i - s);
    tmp[c->i - s] = 0;
    return strtod(tmp, NULL);
}
static jv *parse_value(pctx *c, int depth) {
    if (depth > 32) fail(c, c->i, "nesting too deep");
    int ch = peek(c);
    jv *v = alloc(c, sizeof *v, _Alignof(jv));
    memset(v, 0, sizeof *v);
    v->pos = c->i;
    if (ch == '{' || ch == '[') {
        v->t = ch == '{' ? J_OBJ : J_ARR;
        c->i++;
        jv **tail = &v->kid;
        if (peek(c) == (ch == '{' ? '}' : ']')) { c->i++; return v; }
        for (;;) {
            const char *key = NULL;
            size_t kpos = 0;
            if (v->t == J_OBJ) {
                if (peek(c) != '"') fail(c, c->i, "expected a string key");
                kpos = c->i;
                key = parse_string(c);
                for (jv *m = v->kid; m; m = m->next)
                    if (!strcmp(m->key, key)) fail(c, kpos, "duplicate key '%s'", key);
                expect(c, ':');
            }
            jv *item = parse_value(c, depth + 1);
            item->key = key;
            item->kpos = kpos;
            *tail = item;
            tail = &item->next;
            int end = peek(c);
            c->i++;
            if (end == (v->t == J_OBJ ? '}' : ']')) return v;
            if (end != ',') fail(c, c->i - 1, "expected ',' or '%c'", v->t == J_OBJ ? '}' : ']');
        }
    }
    if (ch == '"') { v->t = J_STR; v->s = parse_string(c); return v; }
    if (ch == '-' || (ch >= '0' && ch <= '9')) { v->t = J_NUM; v->num = parse_number(c); return v; }
    static const char *const lits[] = {"null", "false", "true"};
    for (int k = 0; k < 3; k++) {
        if (!strncmp(c->p + c->i, lits[k], strlen(lits[k]))) {
            c->i += strlen(lits[k]);
            v->t = k ? J_BOOL : J_NULL;
            v->num = k == 2;
            return v;
        }
    }
    fail(c, c->i, ch < 0 ? "unexpected end of file" : "unexpected character");
}

/* ---- typed access to the DOM (every error names the key) ---- */

static const char *kname(const jv *v) { return v->key ? v->key : "array element"; }
static void unknown_key(pctx *c, const jv *m) { fail(c, m->kpos, "unknown key '%s'", m->key); }
static const jv *jtype(pctx *c, const jv *v, enum jt t) {
    static const char *const what[] = {"null", "a bool", "a number", "a string", "an array",
                                       "an object"};
    if (v->t != t) fail(c, v->pos, "'%s' must be %s", kname(v), what[t]);
    return v->kid;
}
static double jnum(pctx *c, const jv *v) { jtype(c, v, J_NUM); return v->num; }
static int jbool(pctx *c, const jv *v) { jtype(c, v, J_BOOL); return v->num != 0; }
static unsigned long long juint(pctx *c, const jv *v, unsigned long long max) {
    double d = jnum(c, v);
    if (!(d >= 0 && d < 18446744073709551616.0) || (double)(unsigned long long)d != d ||
        (unsigned long long)d > max)
        fail(c, v->pos, "'%s' must be an integer from 0 to %llu", kname(v), max);
    return (unsigned long long)d;
}
static int jint(pctx *c, const jv *v, int lo, int hi) {
    double d = jnum(c, v);
    if (!(d >= lo && d <= hi) || (double)(int)d != d)
        fail(c, v->pos, "'%s' must be an integer from %d to %d", kname(v), lo, hi);
    return (int)d;
}
static double jsecs(pctx *c, const jv *v) {
    double d = jnum(c, v);
    if (!(d >= 0 && d < 1e9)) fail(c, v->pos, "'%s' must be a number of seconds >= 0", kname(v));
    return d;
}
static void jstr(pctx *c, const jv *v, char *buf, size_t cap) {
    jtype(c, v, J_STR);
    if (strlen(v->s) >= cap) fail(c, v->pos, "'%s' is longer than %zu bytes", kname(v), cap - 1);
    strcpy(buf, v->s);
}
static ctr_t jctr(pctx *c, const jv *v) {
    ctr_t r = {0, 0};
    if (v->t == J_NUM) { r.base = v->num; return r; }
    if (v->t != J_OBJ)
        fail(c, v->pos, "'%s' must be a number or {\"base\": N, \"per_s\": R}", kname(v));
    for (const jv *m = v->kid; m; m = m->next) {
        if (!strcmp(m->key, "base")) r.base = jnum(c, m);
        else if (!strcmp(m->key, "per_s")) r.per_s = jnum(c, m);
        else unknown_key(c, m);
    }
    return r;
}
static int key_index(const char *const *keys, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return i;
    return -1;
}
static void jctrs(pctx *c, const jv *o, const char *const *keys, int n, ctr_t *out) {
    for (const jv *m = jtype(c, o, J_OBJ); m; m = m->next) {
        int i = key_index(keys, n, m->key);
        if (i < 0) unknown_key(c, m);
        out[i] = jctr(c, m);
    }
}
static void juints(pctx *c, const jv *o, const char *const *keys, int n, unsigned *out,
                   unsigned max) {
    for (const jv *m = jtype(c, o, J_OBJ); m; m = m->next) {
        int i = key_index(keys, n, m->key);
        if (i < 0) unknown_key(c, m);
        out[i] = (unsigned)juint(c, m, max);
    }
}
static nvmlReturn_t jcode(pctx *c, const jv *v) {
    jtype(c, v, J_STR);
    for (size_t i = 1; i < N_CODES; i++)
        if (!strcmp(codes[i].name, v->s)) return codes[i].rc;
    fail(c, v->pos, "'%s': unknown error name '%s' (use e.g. \"NOT_SUPPORTED\")", kname(v), v->s);
}
static int jfn(pctx *c, const jv *m, int lo, int hi, const char *what) {
    for (int f = lo; f < hi; f++)
        if (!strcmp(fn_names[f], m->key)) return f;
    fail(c, m->kpos, "'%s' is not a %s function of the fake", m->key, what);
}
/* A "hang" value: after_s, or {"after_s": a, "until_s": b} (b > a). */
static void jhang(pctx *c, const jv *v, double *after, double *until) {
    *until = -1;
    if (v->t != J_OBJ) { *after = jsecs(c, v); return; }
    *after = 0;
    for (const jv *m = v->kid; m; m = m->next) {
        if (!strcmp(m->key, "after_s")) *after = jsecs(c, m);
        else if (!strcmp(m->key, "until_s")) *until = jsecs(c, m);
        else unknown_key(c, m);
    }
    if (*until >= 0 && *until <= *after) fail(c, v->pos, "'until_s' must be after 'after_s'");
}
static int parse_bdf(const char *s, unsigned v[4]) { /* dddd:bb:dd.f or dddddddd:bb:dd.f */
    size_t n = strlen(s), dl = n - 8;
    if ((n != 12 && n != 16) || s[dl] != ':' || s[dl + 3] != ':' || s[dl + 6] != '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (i != dl && i != dl + 3 && i != dl + 6 && !isxdigit((unsigned char)s[i])) return 0;
    v[0] = (unsigned)strtoul(s, NULL, 16);
    v[1] = (unsigned)strtoul(s + dl + 1, NULL, 16);
    v[2] = (unsigned)strtoul(s + dl + 4, NULL, 16);
    v[3] = (unsigned)strtoul(s + dl + 7, NULL, 16);
    return v[2] <= 0x1f && v[3] <= 7;
}

/* "fabric": {"state", "status", "clique_id", "cluster_uuid", "health_mask",
   "health_summary"}; state names are NVML_GPU_FABRIC_STATE_* without the prefix. */
static void jfabric(pctx *c, const jv *o, gpu_t *g) {
    static const char *const states[] = {"NOT_SUPPORTED", "NOT_STARTED", "IN_PROGRESS",
                                         "COMPLETED"};
    for (const jv *m = jtype(c, o, J_OBJ); m; m = m->next) {
        if (!strcmp(m->key, "state")) {
            jtype(c, m, J_STR);
            int i = key_index(states, 4, m->s);
            if (i < 0)
                fail(c, m->pos, "'state' is NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS or "
                                "COMPLETED, not '%s'", m->s);
            g->fab_state = i; /* NVML_GPU_FABRIC_STATE_* are 0-3 in this order */
        } else if (!strcmp(m->key, "status")) {
            jtype(c, m, J_STR);
            g->fab_status = !strcmp(m->s, "SUCCESS") ? NVML_SUCCESS : jcode(c, m);
        } else if (!strcmp(m->key, "clique_id")) g->fab_clique = (unsigned)juint(c, m, UINT_MAX);
        else if (!strcmp(m->key, "health_mask"))
            g->fab_health_mask = (unsigned)juint(c, m, UINT_MAX);
        else if (!strcmp(m->key, "health_summary"))
            g->fab_health_summary = (unsigned)juint(c, m, 255);
        else if (!strcmp(m->key, "cluster_uuid")) {
            /* 32 hex digits, dashes anywhere between them ignored: a UUID as written. */
            jtype(c, m, J_STR);
            unsigned n = 0;
            for (const char *q = m->s; *q; q++) {
                if (*q == '-') continue;
                if (!isxdigit((unsigned char)*q) || n == 2 * NVML_GPU_FABRIC_UUID_LEN) {
                    n = UINT_MAX;
                    break;
                }
                char hx[2] = {*q, 0};
                unsigned digit = (unsigned)strtoul(hx, NULL, 16);
                g->fab_cluster[n / 2] = (unsigned char)(n % 2 ? g->fab_cluster[n / 2] | digit
                                                              : digit << 4);
                n++;
            }
            if (n != 2 * NVML_GPU_FABRIC_UUID_LEN)
                fail(c, m->pos, "'cluster_uuid' must be 32 hex digits (dashes allowed)");
        } else unknown_key(c, m);
    }
}

static void parse_gpu(pctx *c, const jv *o, gpu_t *g) {
    static const gpu_t dflt = {
        .visible = 1, .pci_device_id = 0x233010DE, .pci_subsystem_id = 0x16C110DE,
        .name = "NVIDIA H100 80GB HBM3", .vbios = "96.00.99.00.01",
        .mem_total = 85520809984ULL, .mem_used = 529530880ULL, .clk_reasons = 1,
        .clk_supported = 0x1FF, .ecc_mode = {1, 1}, .pcie = {5, 5, 5, 16, 16}, .nvl_links = 18,
        .thresh = {92, 89, 95, 87}, .temp = 34, .cc = {9, 0}, .power_mw = 71000,
        .power_limit_mw = 700000, .default_power_limit_mw = 700000, .persistence = 1,
        .arch = NVML_DEVICE_ARCH_HOPPER, .sm_clock = 1980, .max_sm_clock = 1980,
        .mem_clock = 2619, .minor = UINT_MAX, .lost_after = -1, .registered_at = -1,
        .fab_state = -1};
    *g = dflt;
    for (int f = 0; f < N_DEV_FNS; f++) g->hang[f] = g->hang_until[f] = -1;
    int have_bus = 0;
#define IS(k) (!strcmp(m->key, k))
    for (const jv *m = jtype(c, o, J_OBJ); m; m = m->next) {
        if (IS("bus_id")) {
            jtype(c, m, J_STR);
            if (!parse_bdf(m->s, g->pci))
                fail(c, m->pos, "'bus_id' must look like \"0000:18:00.0\"");
            have_bus = 1;
        } else if (IS("visible")) g->visible = jbool(c, m);
        else if (IS("minor")) g->minor = (unsigned)juint(c, m, INT_MAX);
        else if (IS("name")) jstr(c, m, g->name, sizeof g->name);
        else if (IS("uuid")) jstr(c, m, g->uuid, sizeof g->uuid);
        else if (IS("bus_id_reported"))
            jstr(c, m, g->bus_id_reported, sizeof g->bus_id_reported);
        else if (IS("serial")) jstr(c, m, g->serial, sizeof g->serial);
        else if (IS("vbios_version")) jstr(c, m, g->vbios, sizeof g->vbios);
        else if (IS("pci_device_id")) g->pci_device_id = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("pci_subsystem_id")) g->pci_subsystem_id = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("memory_total")) g->mem_total = juint(c, m, ULLONG_MAX);
        else if (IS("memory_used")) g->mem_used = juint(c, m, ULLONG_MAX);
        else if (IS("ecc_mode")) {
            const jv *e = jtype(c, m, J_ARR);
            for (int i = 0; i < 2; i++, e = e->next) {
                if (!e) fail(c, m->pos, "'ecc_mode' must be [current, pending]");
                g->ecc_mode[i] = (unsigned)juint(c, e, 1);
            }
            if (e) fail(c, m->pos, "'ecc_mode' must be [current, pending]");
        } else if (IS("ecc")) jctrs(c, m, ecc_keys, N_ECC, g->ecc);
        else if (IS("remapped_rows")) {
            static const char *const rk[4] = {"correctable", "uncorrectable", "pending", "failure"};
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                int i = key_index(rk, 4, r->key);
                if (i < 0) unknown_key(c, r);
                g->remap[i] = i < 2 ? (unsigned)juint(c, r, UINT_MAX) : (unsigned)jbool(c, r);
            }
        } else if (IS("retired_pages")) {
            static const char *const pk[3] = {"single_bit", "double_bit", "pending"};
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                int i = key_index(pk, 3, r->key);
                if (i < 0) unknown_key(c, r);
                if (i < 2) g->pages[i] = (unsigned)juint(c, r, 65536);
                else g->pages_pending = (unsigned)jbool(c, r);
            }
        } else if (IS("clocks_event_reasons")) g->clk_reasons = juint(c, m, ULLONG_MAX);
        else if (IS("supported_clocks_event_reasons")) g->clk_supported = juint(c, m, ULLONG_MAX);
        else if (IS("throttle_ns")) jctrs(c, m, thr_keys, N_THR, g->thr);
        else if (IS("pcie")) juints(c, m, pcie_keys, N_PCIE, g->pcie, 255);
        else if (IS("pcie_replay")) g->pcie_replay = jctr(c, m);
        else if (IS("nvlink")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                int i = key_index(nvl_keys, N_NVL, r->key);
                if (i >= 0) g->nvl[i] = jctr(c, r);
                else if (!strcmp(r->key, "links"))
                    g->nvl_links = (unsigned)juint(c, r, NVML_NVLINK_MAX_LINKS);
                else if (!strcmp(r->key, "down"))
                    for (const jv *e = jtype(c, r, J_ARR); e; e = e->next)
                        g->nvl_down |= 1ULL << juint(c, e, NVML_NVLINK_MAX_LINKS - 1);
                else unknown_key(c, r);
            }
            if (g->nvl_down >> g->nvl_links) fail(c, m->pos, "'down' names a link >= 'links'");
        } else if (IS("temperature")) {
            double d = jnum(c, m);
            if (!(d >= -2147483648.0 && d <= 4294967295.0) || (double)(long long)d != d)
                fail(c, m->pos, "'temperature' must be an integer from -2147483648 to 4294967295");
            g->temp = (long long)d;
        }
        else if (IS("temperature_thresholds")) juints(c, m, thresh_keys, 4, g->thresh, 1000);
        else if (IS("power_mw")) g->power_mw = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("power_limit_mw")) g->power_limit_mw = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("default_power_limit_mw"))
            g->default_power_limit_mw = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("persistence_mode")) g->persistence = (unsigned)jbool(c, m);
        else if (IS("recovery_action")) g->recovery_action = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("utilization")) juints(c, m, util_keys, 2, g->util, 100);
        else if (IS("architecture")) g->arch = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("compute_capability")) {
            const jv *e = jtype(c, m, J_ARR);
            if (!e || !e->next || e->next->next)
                fail(c, m->pos, "'compute_capability' must be [major, minor]");
            g->cc[0] = jint(c, e, 0, 100);
            g->cc[1] = jint(c, e->next, 0, 100);
        } else if (IS("pstate")) {
            g->pstate = (unsigned)juint(c, m, NVML_PSTATE_UNKNOWN);
            if (g->pstate > NVML_PSTATE_15 && g->pstate != NVML_PSTATE_UNKNOWN)
                fail(c, m->pos, "'pstate' must be 0-15 or 32");
        } else if (IS("sm_clock_mhz")) g->sm_clock = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("max_sm_clock_mhz")) g->max_sm_clock = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("mem_clock_mhz")) g->mem_clock = (unsigned)juint(c, m, UINT_MAX);
        else if (IS("processes")) {
            for (const jv *e = jtype(c, m, J_ARR); e; e = e->next) {
                if (g->nproc == MAX_ITEMS) fail(c, e->pos, "more than %d processes", MAX_ITEMS);
                g->proc[g->nproc].until = -1;
                for (const jv *r = jtype(c, e, J_OBJ); r; r = r->next) {
                    if (!strcmp(r->key, "pid")) g->proc[g->nproc].pid = (unsigned)juint(c, r, UINT_MAX);
                    else if (!strcmp(r->key, "used_memory")) g->proc[g->nproc].mem = juint(c, r, ULLONG_MAX);
                    else if (!strcmp(r->key, "after_s")) g->proc[g->nproc].after = jsecs(c, r);
                    else if (!strcmp(r->key, "until_s")) g->proc[g->nproc].until = jsecs(c, r);
                    else unknown_key(c, r);
                }
                g->nproc++;
            }
        } else if (IS("xids")) {
            for (const jv *e = jtype(c, m, J_ARR); e; e = e->next) {
                if (g->nxid == MAX_ITEMS) fail(c, e->pos, "more than %d xids", MAX_ITEMS);
                int have_xid = 0;
                for (const jv *r = jtype(c, e, J_OBJ); r; r = r->next) {
                    if (!strcmp(r->key, "xid")) { g->xid[g->nxid].xid = juint(c, r, ULLONG_MAX); have_xid = 1; }
                    else if (!strcmp(r->key, "after_s")) g->xid[g->nxid].after = jsecs(c, r);
                    else unknown_key(c, r);
                }
                if (!have_xid) fail(c, e->pos, "an xid event needs an 'xid'");
                g->nxid++;
            }
        } else if (IS("errors")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next)
                g->err[jfn(c, r, 0, N_DEV_FNS, "per-device")] = jcode(c, r);
        } else if (IS("hang")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                int f = jfn(c, r, 0, N_DEV_FNS, "per-device");
                jhang(c, r, &g->hang[f], &g->hang_until[f]);
            }
        } else if (IS("unsupported_fields")) {
            for (const jv *e = jtype(c, m, J_ARR); e; e = e->next) {
                if (g->nunsup == MAX_ITEMS) fail(c, e->pos, "more than %d fields", MAX_ITEMS);
                g->unsup[g->nunsup++] = (unsigned)juint(c, e, UINT_MAX);
            }
        } else if (IS("field_errors")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                char *end;
                unsigned long id = strtoul(r->key, &end, 10);
                if (!*r->key || *end || id > UINT_MAX)
                    fail(c, r->pos, "field_errors keys are field ids, not '%s'", r->key);
                if (g->nfielderr == MAX_ITEMS) fail(c, r->pos, "more than %d fields", MAX_ITEMS);
                g->fielderr_id[g->nfielderr] = (unsigned)id;
                g->fielderr_rc[g->nfielderr++] = jcode(c, r);
            }
        } else if (IS("fabric")) jfabric(c, m, g);
        else if (IS("lost_after_s")) {
            if (m->t != J_NULL) g->lost_after = jsecs(c, m);
        } else if (IS("timed_from")) {
            jtype(c, m, J_STR);
            if (!strcmp(m->s, "registration")) g->from_registration = 1;
            else if (strcmp(m->s, "load"))
                fail(c, m->pos, "'timed_from' is \"load\" or \"registration\", not '%s'", m->s);
        } else unknown_key(c, m);
    }
    if (!have_bus) fail(c, o->pos, "a GPU needs a 'bus_id'");
    /* A GPU without NVLink has no fabric to join: NVML answers state NOT_SUPPORTED. */
    if (g->fab_state < 0)
        g->fab_state = g->nvl_links ? NVML_GPU_FABRIC_STATE_COMPLETED
                                    : NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    if (g->mem_used > g->mem_total) fail(c, o->pos, "'memory_used' exceeds 'memory_total'");
    unsigned *p = g->pci;
    if (!g->uuid[0])
        snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-%04x-%04x-%04x-000000000000", p[0],
                 p[1] & 0xff, p[2] & 0x1f, p[3] & 7);
    if (!g->serial[0])
        snprintf(g->serial, sizeof g->serial, "%llu",
                 1650000000000ULL + ((unsigned long long)p[0] << 16 | p[1] << 8 | p[2] << 3 | p[3]));
}

static void parse_scenario(pctx *c, const jv *root, scen_t *s) {
    memset(s, 0, sizeof *s);
    strcpy(s->driver_version, "570.124.06");
    strcpy(s->nvml_version, "12.570.124.06");
    s->cuda_version = 12080;
    s->hang_s = 3600;
    for (int f = 0; f < N_FNS; f++) s->hang[f] = s->hang_until[f] = -1;
    s->device_count = -1;
    for (const jv *m = jtype(c, root, J_OBJ); m; m = m->next) {
        if (IS("driver_version")) jstr(c, m, s->driver_version, sizeof s->driver_version);
        else if (IS("nvml_version")) jstr(c, m, s->nvml_version, sizeof s->nvml_version);
        else if (IS("cuda_driver_version")) s->cuda_version = jint(c, m, 0, INT_MAX);
        else if (IS("init_error")) s->init_error = jcode(c, m);
        else if (IS("init_hang_s")) s->init_hang_s = jsecs(c, m);
        else if (IS("device_count")) s->device_count = (long long)juint(c, m, UINT_MAX);
        else if (IS("hang_s")) s->hang_s = jsecs(c, m);
        else if (IS("description")) jtype(c, m, J_STR);
        else if (IS("hang")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next) {
                int f = jfn(c, r, N_DEV_FNS, N_FNS, "system/global");
                jhang(c, r, &s->hang[f], &s->hang_until[f]);
            }
        } else if (IS("errors")) {
            for (const jv *r = jtype(c, m, J_OBJ); r; r = r->next)
                s->err[jfn(c, r, N_DEV_FNS, N_FNS, "system/global")] = jcode(c, r);
        } else if (IS("gpus")) {
            for (const jv *e = jtype(c, m, J_ARR); e; e = e->next) {
                if (s->ngpus == MAX_GPUS) fail(c, e->pos, "more than %d GPUs", MAX_GPUS);
                gpu_t *g = &s->gpus[s->ngpus];
                parse_gpu(c, e, g);
                for (int k = 0; k < s->ngpus; k++)
                    if (!memcmp(s->gpus[k].pci, g->pci, sizeof g->pci))
                        fail(c, e->pos, "two GPUs have the same 'bus_id'");
                g->slot = s->ngpus++;
            }
        } else unknown_key(c, m);
    }
#undef IS
    int index = 0;
    for (int k = 0; k < s->ngpus; k++) {
        gpu_t *g = &s->gpus[k];
        g->index = g->visible ? index++ : -1;
        if (g->minor == UINT_MAX) g->minor = (unsigned)(g->visible ? g->index : k);
    }
}

/* Parses the file into *s; on failure prints one line to stderr and returns 0. */
static int load_scenario(const char *path, scen_t *s) {
    pctx c = {.path = path};
    if (setjmp(c.jb)) {
        free(c.buf);
        free(c.arena);
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) fail(&c, 0, "cannot open (%s)", strerror(errno));
    c.buf = malloc(MAX_FILE + 1);
    c.n = c.buf ? fread(c.buf, 1, MAX_FILE + 1, f) : 0;
    fclose(f);
    if (!c.buf || c.n > MAX_FILE) fail(&c, 0, "cannot read, or larger than %d bytes", MAX_FILE);
    c.buf[c.n] = 0;
    c.p = c.buf;
    c.cap = (c.n + 2) * (sizeof(jv) + _Alignof(jv)) + c.n + 16;
    if (!(c.arena = malloc(c.cap))) fail(&c, 0, "out of memory");
    jv *root = parse_value(&c, 0);
    root->key = "top level";
    if (peek(&c) >= 0) fail(&c, c.i, "trailing characters after the document");
    parse_scenario(&c, root, s);
    free(c.buf);
    free(c.arena);
    return 1;
}

/* ---- init, shutdown ---- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&init_mu);
    const char *path = getenv("FAKE_NVML_SCENARIO");
    struct stat sb;
    if (!path || !*path || stat(path, &sb) != 0) {
        if (path && *path) fprintf(stderr, "fake-nvml: %s: no such scenario file\n", path);
        pthread_mutex_unlock(&init_mu);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    long long mtime = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    pthread_mutex_lock(&mu);
    int reload = !refcount || !loaded || strcmp(path, loaded_path) || mtime != loaded_mtime;
    pthread_mutex_unlock(&mu);
    if (reload) {
        scen_t *s = malloc(sizeof *s);
        int ok = s && load_scenario(path, s);
        pthread_mutex_lock(&mu);
        loaded = ok;
        if (ok) {
            S = *s;
            t0 = mono();
            generation++;
            snprintf(loaded_path, sizeof loaded_path, "%s", path);
            loaded_mtime = mtime;
        }
        pthread_mutex_unlock(&mu);
        free(s);
        if (!ok) {
            pthread_mutex_unlock(&init_mu);
            return NVML_ERROR_UNKNOWN;
        }
    }
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = S.init_error;
    double hang = S.init_hang_s;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&init_mu);
    if (hang > 0) nap(hang);
    if (rc) return rc;
    pthread_mutex_lock(&mu);
    refcount++;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return do_init(); }
nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }
nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = refcount ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (refcount) refcount--;
    pthread_mutex_unlock(&mu);
    return rc;
}
const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < N_CODES; i++)
        if (codes[i].rc == result) return codes[i].text;
    return "Unknown Error";
}

/* ---- preconditions: every call goes through genter() or enter() ---- */

/* Sleeps (without the lock) until the scenario changes or hang_s passes. */
static nvmlReturn_t hang_until(unsigned gen, double limit) {
    double start = mono();
    for (;;) {
        pthread_mutex_lock(&mu);
        unsigned now = generation;
        pthread_mutex_unlock(&mu);
        if (now != gen || mono() - start >= limit) return NVML_ERROR_UNKNOWN;
        nap(0.01);
    }
}
/* System/global functions: initialized? top-level "hang"? */
static nvmlReturn_t genter(int f) {
    pthread_mutex_lock(&mu);
    if (!refcount) { pthread_mutex_unlock(&mu); return NVML_ERROR_UNINITIALIZED; }
    double since = mono() - t0;
    if (S.hang[f] >= 0 && since >= S.hang[f] && (S.hang_until[f] < 0 || since < S.hang_until[f])) {
        unsigned gen = generation;
        double limit = S.hang_s;
        if (S.hang_until[f] >= 0 && S.hang_until[f] - since < limit) limit = S.hang_until[f] - since;
        pthread_mutex_unlock(&mu);
        return hang_until(gen, limit);
    }
    nvmlReturn_t injected = S.err[f];
    pthread_mutex_unlock(&mu);
    return injected;
}
/* Seconds since t0 at which a timed fault of the GPU ("lost_after_s", an XID's "after_s")
 * falls due: `after` itself, or after the GPU's first XID registration with "timed_from":
 * "registration" (1e300, never, before it). */
static double due_at(const gpu_t *g, double after) {
    if (!g->from_registration) return after;
    return g->registered_at < 0 ? 1e300 : g->registered_at + after;
}
/* With mu held: the GPU's "hang", "lost_after_s" and "errors" for function f,
 * else a copy of the GPU in *out. Releases mu. */
static nvmlReturn_t gate(int slot, int f, gpu_t *out) {
    const gpu_t *g = &S.gpus[slot];
    double t = mono() - t0;
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g->hang[f] >= 0 && t >= g->hang[f] && (g->hang_until[f] < 0 || t < g->hang_until[f])) {
        unsigned gen = generation;
        double limit = S.hang_s;
        if (g->hang_until[f] >= 0 && g->hang_until[f] - t < limit) limit = g->hang_until[f] - t;
        pthread_mutex_unlock(&mu);
        return hang_until(gen, limit);
    }
    if (g->lost_after >= 0 && t >= due_at(g, g->lost_after)) rc = NVML_ERROR_GPU_IS_LOST;
    else if (g->err[f]) rc = g->err[f];
    else { *out = *g; out->t = t; }
    pthread_mutex_unlock(&mu);
    return rc;
}
static int slot_of(nvmlDevice_t d) {
    uintptr_t a = (uintptr_t)d, b = (uintptr_t)handles;
    if (a < b || a >= b + sizeof handles || (a - b) % sizeof handles[0]) return -1;
    int slot = (int)((a - b) / sizeof handles[0]);
    return slot < S.ngpus && S.gpus[slot].visible ? slot : -1;
}
/* Per-device functions: initialized? valid handle? then gate(). */
static nvmlReturn_t enter(nvmlDevice_t device, int f, gpu_t *out) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = !refcount ? NVML_ERROR_UNINITIALIZED
                    : slot_of(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
    if (rc) { pthread_mutex_unlock(&mu); return rc; }
    return gate(slot_of(device), f, out);
}
#define ENTER(fn, ...)                                                          \
    gpu_t g;                                                                    \
    nvmlReturn_t rc = enter(device, F_##fn, &g);                                \
    if (rc) return rc;                                                          \
    if (__VA_ARGS__) return NVML_ERROR_INVALID_ARGUMENT

/* ---- system functions ---- */

static nvmlReturn_t put_str(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) >= len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}
static nvmlReturn_t sys_str(int f, char *buf, unsigned len) {
    char tmp[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    nvmlReturn_t rc = genter(f);
    if (rc) return rc;
    pthread_mutex_lock(&mu);
    strcpy(tmp, f == F_nvmlSystemGetNVMLVersion ? S.nvml_version : S.driver_version);
    pthread_mutex_unlock(&mu);
    return put_str(buf, len, tmp);
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return sys_str(F_nvmlSystemGetDriverVersion, version, length);
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return sys_str(F_nvmlSystemGetNVMLVersion, version, length);
}
static nvmlReturn_t sys_int(int f, int *out, int which) {
    nvmlReturn_t rc = genter(f);
    if (rc || !out) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (which && S.device_count >= 0) *out = (int)(unsigned)S.device_count;
    else if (which) {
        *out = 0;
        for (int k = 0; k < S.ngpus; k++) *out += S.gpus[k].visible;
    } else *out = S.cuda_version;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    return sys_int(F_nvmlSystemGetCudaDriverVersion, v, 0);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return sys_int(F_nvmlSystemGetCudaDriverVersion_v2, v, 0);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) {
    return sys_int(F_nvmlDeviceGetCount, (int *)n, 1);
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    return sys_int(F_nvmlDeviceGetCount_v2, (int *)n, 1);
}

/* ---- handle lookups (the found GPU's lost/errors/hang apply) ---- */

enum { BY_INDEX, BY_BUS, BY_UUID };
static nvmlReturn_t lookup(int f, int by, const char *key, unsigned index, nvmlDevice_t *out) {
    unsigned bdf[4] = {0};
    gpu_t g;
    pthread_mutex_lock(&mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    int slot = -1;
    if (!refcount) rc = NVML_ERROR_UNINITIALIZED;
    else if (!out || (by != BY_INDEX && !key) || (by == BY_BUS && !parse_bdf(key, bdf)))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; !rc && slot < 0 && k < S.ngpus; k++) {
        const gpu_t *c = &S.gpus[k];
        if (c->visible && (by == BY_INDEX ? (unsigned)c->index == index
                           : by == BY_BUS ? !memcmp(c->pci, bdf, sizeof bdf)
                                          : !strcasecmp(c->uuid, key)))
            slot = k;
    }
    if (!rc && slot < 0) rc = by == BY_INDEX ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_FOUND;
    if (rc) { pthread_mutex_unlock(&mu); return rc; }
    rc = gate(slot, f, &g);
    if (!rc) *out = &handles[slot];
    return rc;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return lookup(F_nvmlDeviceGetHandleByIndex, BY_INDEX, NULL, index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return lookup(F_nvmlDeviceGetHandleByIndex_v2, BY_INDEX, NULL, index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return lookup(F_nvmlDeviceGetHandleByPciBusId, BY_BUS, pciBusId, 0, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return lookup(F_nvmlDeviceGetHandleByPciBusId_v2, BY_BUS, pciBusId, 0, device);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return lookup(F_nvmlDeviceGetHandleByUUID, BY_UUID, uuid, 0, device);
}

/* ---- simple per-device getters ---- */

#define GETTER(fn, T, expr)                                                     \
    nvmlReturn_t fn(nvmlDevice_t device, T *out) {                              \
        ENTER(fn, !out);                                                        \
        *out = (T)(expr);                                                       \
        return NVML_SUCCESS;                                                    \
    }
#define STR_GETTER(fn, field)                                                   \
    nvmlReturn_t fn(nvmlDevice_t device, char *buf, unsigned int length) {      \
        ENTER(fn, 0);                                                           \
        return put_str(buf, length, g.field);                                   \
    }
#define FEATURE(x) ((x) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)
GETTER(nvmlDeviceGetIndex, unsigned int, g.index)
GETTER(nvmlDeviceGetMinorNumber, unsigned int, g.minor)
STR_GETTER(nvmlDeviceGetName, name)
STR_GETTER(nvmlDeviceGetUUID, uuid)
STR_GETTER(nvmlDeviceGetSerial, serial)
STR_GETTER(nvmlDeviceGetVbiosVersion, vbios)
GETTER(nvmlDeviceGetRetiredPagesPendingStatus, nvmlEnableState_t, FEATURE(g.pages_pending))
GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, g.clk_reasons)
GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long, g.clk_reasons)
GETTER(nvmlDeviceGetSupportedClocksEventReasons, unsigned long long, g.clk_supported)
GETTER(nvmlDeviceGetSupportedClocksThrottleReasons, unsigned long long, g.clk_supported)
GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, g.pcie[PCIE_GEN])
GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, g.pcie[PCIE_MAX_GEN])
GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, unsigned int, g.pcie[PCIE_GPU_MAX_GEN])
GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, g.pcie[PCIE_WIDTH])
GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, g.pcie[PCIE_MAX_WIDTH])
GETTER(nvmlDeviceGetPcieReplayCounter, unsigned int, cval(g.pcie_replay, g.t))
GETTER(nvmlDeviceGetPowerUsage, unsigned int, g.power_mw)
GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, g.power_limit_mw)
GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, g.power_limit_mw)
GETTER(nvmlDeviceGetPowerManagementDefaultLimit, unsigned int, g.default_power_limit_mw)
GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, FEATURE(g.persistence))
GETTER(nvmlDeviceGetSupportedEventTypes, unsigned long long, SUPPORTED_EVENTS)
GETTER(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, g.arch)
GETTER(nvmlDeviceGetPerformanceState, nvmlPstates_t, g.pstate)
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    ENTER(nvmlDeviceGetUtilizationRates, !u);
    u->gpu = g.util[0];
    u->memory = g.util[1];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    ENTER(nvmlDeviceGetCudaComputeCapability, !major || !minor);
    *major = g.cc[0];
    *minor = g.cc[1];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                  nvmlEnableState_t *pending) {
    ENTER(nvmlDeviceGetEccMode, !current || !pending);
    *current = FEATURE(g.ecc_mode[0]);
    *pending = FEATURE(g.ecc_mode[1]);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    ENTER(nvmlDeviceGetRemappedRows, !corrRows || !uncRows || !isPending || !failureOccurred);
    *corrRows = g.remap[0];
    *uncRows = g.remap[1];
    *isPending = g.remap[2];
    *failureOccurred = g.remap[3];
    return NVML_SUCCESS;
}

/* ---- per-device functions with arguments ---- */

static nvmlReturn_t pci_info(nvmlDevice_t device, int f, nvmlPciInfo_t *pci) {
    gpu_t g;
    nvmlReturn_t rc = enter(device, f, &g);
    if (rc || !pci) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned *p = g.pci;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", p[0] & 0xffff,
             p[1] & 0xff, p[2] & 0x1f, p[3] & 7);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", p[0], p[1] & 0xff,
             p[2] & 0x1f, p[3] & 7);
    if (g.bus_id_reported[0]) memcpy(pci->busId, g.bus_id_reported, sizeof pci->busId);
    pci->domain = p[0];
    pci->bus = p[1];
    pci->device = p[2];
    pci->pciDeviceId = g.pci_device_id;
    pci->pciSubSystemId = g.pci_subsystem_id;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, F_nvmlDeviceGetPciInfo, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, F_nvmlDeviceGetPciInfo_v2, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, F_nvmlDeviceGetPciInfo_v3, pci);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER(nvmlDeviceGetMemoryInfo, !memory);
    memory->total = g.mem_total;
    memory->used = g.mem_used;
    memory->free = g.mem_total - g.mem_used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ENTER(nvmlDeviceGetMemoryInfo_v2, !memory);
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = g.mem_total;
    memory->reserved = 0;
    memory->used = g.mem_used;
    memory->free = g.mem_total - g.mem_used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts) {
    ENTER(nvmlDeviceGetTotalEccErrors, !eccCounts || (unsigned)errorType > 1 ||
                                           (unsigned)counterType > 1);
    /* ECC_VC, ECC_VU, ECC_AC, ECC_AU */
    *eccCounts = cval(g.ecc[counterType * 2 + errorType], g.t);
    return NVML_SUCCESS;
}
static nvmlReturn_t retired(nvmlDevice_t device, int f, nvmlPageRetirementCause_t cause,
                            unsigned *count, unsigned long long *addresses,
                            unsigned long long *timestamps) {
    gpu_t g;
    nvmlReturn_t rc = enter(device, f, &g);
    if (rc || !count || (unsigned)cause > 1) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = g.pages[cause];
    if (*count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    if (n && !addresses) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n; i++) {
        addresses[i] = 0x100000ULL * (cause + 1) + i;
        if (timestamps) timestamps[i] = (unsigned long long)(wall_us() / 1000000 - (long long)g.t);
    }
    *count = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    return retired(device, F_nvmlDeviceGetRetiredPages, cause, pageCount, addresses, NULL);
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired(device, F_nvmlDeviceGetRetiredPages_v2, cause, pageCount, addresses,
                   timestamps);
}
nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime) {
    ENTER(nvmlDeviceGetViolationStatus, !violTime || perfPolicyType >= NVML_PERF_POLICY_COUNT);
    int k = perfPolicyType == NVML_PERF_POLICY_POWER        ? THR_SW_POWER
          : perfPolicyType == NVML_PERF_POLICY_THERMAL      ? THR_SW_THERMAL
          : perfPolicyType == NVML_PERF_POLICY_SYNC_BOOST   ? THR_SYNC_BOOST : -1;
    if (k < 0) return NVML_ERROR_NOT_SUPPORTED;
    violTime->referenceTime = (unsigned long long)wall_us();
    violTime->violationTime = cval(g.thr[k], g.t);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive) {
    ENTER(nvmlDeviceGetNvLinkState, !isActive);
    if (!g.nvl_links) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g.nvl_links) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = FEATURE(!(g.nvl_down >> link & 1));
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue) {
    /* nvmlNvLinkErrorCounter_t order -> NVL_* */
    static const int which[NVML_NVLINK_ERROR_COUNT] = {NVL_REPLAY, NVL_RECOVERY, NVL_CRC_FLIT,
                                                       NVL_CRC_DATA, NVL_ECC_DATA};
    ENTER(nvmlDeviceGetNvLinkErrorCounter, !counterValue || counter >= NVML_NVLINK_ERROR_COUNT);
    if (!g.nvl_links) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g.nvl_links) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total = cval(g.nvl[which[counter]], g.t);
    *counterValue = total / g.nvl_links + (link < total % g.nvl_links);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    ENTER(nvmlDeviceGetTemperatureV, !temperature);
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)(unsigned)g.temp; /* wraps as the C int does */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp) {
    ENTER(nvmlDeviceGetTemperature, !temp || sensorType != NVML_TEMPERATURE_GPU);
    *temp = g.temp < 0 ? 0 : (unsigned)g.temp;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                               nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    ENTER(nvmlDeviceGetTemperatureThreshold, !temp || thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT);
    if (thresholdType > NVML_TEMPERATURE_THRESHOLD_GPU_MAX) return NVML_ERROR_NOT_SUPPORTED;
    *temp = g.thresh[thresholdType];
    return NVML_SUCCESS;
}
static nvmlReturn_t clock_info(nvmlDevice_t device, int f, nvmlClockType_t type, unsigned *clock,
                               int max) {
    gpu_t g;
    nvmlReturn_t rc = enter(device, f, &g);
    if (rc || !clock || type >= NVML_CLOCK_COUNT) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (type == NVML_CLOCK_GRAPHICS || type == NVML_CLOCK_SM)
        *clock = max ? g.max_sm_clock : g.sm_clock;
    else if (type == NVML_CLOCK_MEM) *clock = g.mem_clock;
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                    unsigned int *clock) {
    return clock_info(device, F_nvmlDeviceGetClockInfo, type, clock, 0);
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock) {
    return clock_info(device, F_nvmlDeviceGetMaxClockInfo, type, clock, 1);
}
static nvmlReturn_t processes(nvmlDevice_t device, int f, unsigned *count,
                              nvmlProcessInfo_t *infos) {
    gpu_t g;
    nvmlReturn_t rc = enter(device, f, &g);
    if (rc || !count) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    /* Only the processes alive now: from after_s on, until until_s (if given). */
    unsigned live[MAX_ITEMS], n = 0;
    if (f == F_nvmlDeviceGetComputeRunningProcesses_v3)
        for (unsigned i = 0; i < g.nproc; i++)
            if (g.t >= g.proc[i].after && (g.proc[i].until < 0 || g.t < g.proc[i].until))
                live[n++] = i;
    if (*count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    if (n && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < n; i++)
        infos[i] = (nvmlProcessInfo_t){g.proc[live[i]].pid, g.proc[live[i]].mem, 0xFFFFFFFFu,
                                       0xFFFFFFFFu};
    *count = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    return processes(device, F_nvmlDeviceGetComputeRunningProcesses_v3, infoCount, infos);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    return processes(device, F_nvmlDeviceGetGraphicsRunningProcesses_v3, infoCount, infos);
}

/* ---- NVLink fabric ---- */

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    ENTER(nvmlDeviceGetGpuFabricInfo, !gpuFabricInfo);
    memcpy(gpuFabricInfo->clusterUuid, g.fab_cluster, sizeof g.fab_cluster);
    gpuFabricInfo->status = g.fab_status;
    gpuFabricInfo->cliqueId = g.fab_clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g.fab_state;
    return NVML_SUCCESS;
}
/* Takes nvmlGpuFabricInfo_v2_t or _v3_t, told apart by `version` as the real library does;
   v3 is v2 with healthSummary appended, so one pointer fills both. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                         nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    ENTER(nvmlDeviceGetGpuFabricInfoV, !gpuFabricInfo);
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memcpy(gpuFabricInfo->clusterUuid, g.fab_cluster, sizeof g.fab_cluster);
    gpuFabricInfo->status = g.fab_status;
    gpuFabricInfo->cliqueId = g.fab_clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g.fab_state;
    gpuFabricInfo->healthMask = g.fab_health_mask;
    if (version == nvmlGpuFabricInfo_v3)
        gpuFabricInfo->healthSummary = (unsigned char)g.fab_health_summary;
    return NVML_SUCCESS;
}

/* ---- field values ---- */

static void field_value(const gpu_t *g, nvmlFieldValue_t *v) {
    unsigned long long x = 0;
    int ull = 1, nvl = 0; /* nvl: needs NVLink */
    nvmlReturn_t rc = NVML_SUCCESS;
    switch (v->fieldId) {
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: x = cval(g->thr[THR_SW_POWER], g->t); break;
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: x = cval(g->thr[THR_SYNC_BOOST], g->t); break;
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: x = cval(g->thr[THR_SW_THERMAL], g->t); break;
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: x = cval(g->thr[THR_HW_THERMAL], g->t); break;
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: x = cval(g->thr[THR_HW_BRAKE], g->t); break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: x = cval(g->pcie_replay, g->t); break;
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: x = 0; break;
    case NVML_FI_DEV_NVLINK_LINK_COUNT: x = g->nvl_links; ull = 0; nvl = 1; break;
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: x = cval(g->nvl[NVL_CRC_FLIT], g->t); nvl = 1; break;
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: x = cval(g->nvl[NVL_CRC_DATA], g->t); nvl = 1; break;
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: x = cval(g->nvl[NVL_REPLAY], g->t); nvl = 1; break;
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: x = cval(g->nvl[NVL_RECOVERY], g->t); nvl = 1; break;
    case NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: x = cval(g->nvl[NVL_ECC_DATA], g->t); nvl = 1; break;
    case NVML_FI_DEV_REMAPPED_COR: case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING: case NVML_FI_DEV_REMAPPED_FAILURE:
        x = g->remap[v->fieldId - NVML_FI_DEV_REMAPPED_COR]; ull = 0; break;
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: x = g->recovery_action; ull = 0; break;
    default: rc = NVML_ERROR_NOT_SUPPORTED;
    }
    if (nvl && !g->nvl_links) rc = NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < g->nunsup; i++)
        if (g->unsup[i] == v->fieldId) rc = NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < g->nfielderr; i++)
        if (g->fielderr_id[i] == v->fieldId) rc = g->fielderr_rc[i];
    v->timestamp = wall_us();
    v->latencyUsec = 0;
    v->nvmlReturn = rc;
    if (rc) return;
    v->valueType = ull ? NVML_VALUE_TYPE_UNSIGNED_LONG_LONG : NVML_VALUE_TYPE_UNSIGNED_INT;
    if (ull) v->value.ullVal = x;
    else v->value.uiVal = (unsigned)x;
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    ENTER(nvmlDeviceGetFieldValues, valuesCount < 0 || (valuesCount && !values));
    for (int i = 0; i < valuesCount; i++) field_value(&g, &values[i]);
    return NVML_SUCCESS;
}

/* ---- events ---- */

static struct nvmlEventSet_st *set_of(nvmlEventSet_t s) { /* with mu held */
    uintptr_t a = (uintptr_t)s, b = (uintptr_t)sets;
    if (a < b || a >= b + sizeof sets || (a - b) % sizeof sets[0]) return NULL;
    return s->used ? s : NULL;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t rc = genter(F_nvmlEventSetCreate);
    if (rc || !set) return rc ? rc : NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    rc = NVML_ERROR_MEMORY;
    for (int i = 0; i < MAX_SETS && rc; i++) {
        if (sets[i].used) continue;
        memset(&sets[i], 0, sizeof sets[i]);
        sets[i].used = 1;
        sets[i].gen = generation;
        *set = &sets[i];
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t rc = genter(F_nvmlEventSetFree);
    if (rc) return rc;
    pthread_mutex_lock(&mu);
    struct nvmlEventSet_st *es = set_of(set);
    if (es) es->used = 0;
    pthread_mutex_unlock(&mu);
    return es ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    ENTER(nvmlDeviceRegisterEvents, 0);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    struct nvmlEventSet_st *es = set_of(set);
    if (es) es->reg[g.slot] |= eventTypes;
    gpu_t *registered = &S.gpus[g.slot];
    if (es && eventTypes & nvmlEventTypeXidCriticalError && registered->registered_at < 0)
        registered->registered_at = mono() - t0;
    pthread_mutex_unlock(&mu);
    return es ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}
/* Delivers the earliest due, undelivered XID of the set's GPUs (mu held). */
static int next_xid(struct nvmlEventSet_st *es, nvmlEventData_t *data) {
    if (es->gen != generation) {
        memset(es->delivered, 0, sizeof es->delivered);
        es->gen = generation;
    }
    double t = mono() - t0, best = 1e300;
    int bs = -1, bi = -1;
    for (int s = 0; s < S.ngpus; s++) {
        const gpu_t *g = &S.gpus[s];
        if (!g->visible || !(es->reg[s] & nvmlEventTypeXidCriticalError)) continue;
        for (unsigned i = 0; i < g->nxid; i++)
            if (!(es->delivered[s] >> i & 1) && due_at(g, g->xid[i].after) <= t &&
                due_at(g, g->xid[i].after) < best) {
                best = due_at(g, g->xid[i].after);
                bs = s;
                bi = (int)i;
            }
    }
    if (bs < 0) return 0;
    es->delivered[bs] |= 1ULL << bi;
    data->device = &handles[bs];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = S.gpus[bs].xid[bi].xid;
    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
    return 1;
}
/* Seconds until the set's next undelivered XID falls due; 1e300 when none will (mu held). */
static double next_due(const struct nvmlEventSet_st *es) {
    double t = mono() - t0, best = 1e300;
    for (int s = 0; s < S.ngpus; s++) {
        const gpu_t *g = &S.gpus[s];
        if (!g->visible || !(es->reg[s] & nvmlEventTypeXidCriticalError)) continue;
        for (unsigned i = 0; i < g->nxid; i++)
            if (!(es->delivered[s] >> i & 1) && due_at(g, g->xid[i].after) - t < best)
                best = due_at(g, g->xid[i].after) - t;
    }
    return best;
}
static nvmlReturn_t event_wait(int f, nvmlEventSet_t set, nvmlEventData_t *data, unsigned ms) {
    nvmlReturn_t rc = genter(f);
    if (rc) return rc;
    double deadline = mono() + ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&mu);
        struct nvmlEventSet_st *es = set_of(set);
        rc = !refcount ? NVML_ERROR_UNINITIALIZED
           : !es || !data ? NVML_ERROR_INVALID_ARGUMENT
           : next_xid(es, data) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
        double due = rc == NVML_ERROR_TIMEOUT && es ? next_due(es) : 0;
        pthread_mutex_unlock(&mu);
        double left = deadline - mono();
        if (rc != NVML_ERROR_TIMEOUT || left <= 0) return rc;
        /* Sleep until the next XID is due or the wait times out, as a real driver blocks,
           but at most 0.25 s, to notice a scenario reload: a waiting listener (the agent's
           waits all the time) must cost next to nothing, as it does on a real node. */
        double step = due < left ? due : left;
        nap(step < 0.001 ? 0.001 : step > 0.25 ? 0.25 : step);
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return event_wait(F_nvmlEventSetWait, set, data, timeoutms);
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    return event_wait(F_nvmlEventSetWait_v2, set, data, timeoutms);
}
