/* log.h — structured logs for the long-running commands (controller, agent).
 *
 * One line per record on stderr: JSON lines (one object with ts, level,
 * component, msg and the key/value pairs; for log collectors) or text for
 * humans (`2026-11-30T04:40:00.123Z INFO  watch: msg key=value ...`).
 * Thread-safe: a record is formatted aside and written with one write(2), so
 * lines from different threads never interleave.
 */
#ifndef COZYGPU_LOG_H
#define COZYGPU_LOG_H

typedef enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;

/* Chooses the format (json != 0: JSON lines; 0: text) and the lowest level
 * written. Call once at start, before other threads log. Default: text, INFO. */
void log_setup(int json, log_level min);

/* Parses "debug", "info", "warn", "error" into *out. Returns 0, or -1 for
 * anything else (*out untouched). */
int log_level_parse(const char *name, log_level *out);

/* Writes one record. `component` names the module ("watch", "webhook"),
 * `msg` is a constant sentence; then key, value pairs of strings ending with
 * NULL. A NULL value is written as null (JSON) or "-" (text). Values are
 * escaped for JSON and quoted in text when they contain spaces or quotes. */
void log_write(log_level lvl, const char *component, const char *msg, ...) __attribute__((sentinel));

#endif
