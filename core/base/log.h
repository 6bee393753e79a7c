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

/* Marks a key whose value is a number: write it as its own string literal
 * in front of the key, `LOG_NUM "port", portbuf` (a separate literal, so
 * that the key's first letters are not read as more hex digits of the
 * escape). The value is still the number's text (snprintf "%d", "%ld",
 * "%.0f"...); JSON lines write it as a JSON number, bare, when it is one by
 * RFC 8259 §6 (optional '-', integer part without leading zeros, optional
 * fraction and exponent), else as a string, so a caller's mistake never
 * makes a line that is not JSON. Text lines write key=value as for any key.
 * The mark is on the key rather than guessed from the value: a value that
 * only looks numeric (a name "42", a resourceVersion) stays a string, and a
 * key keeps one JSON type in every record. */
#define LOG_NUM "\x1f"

/* Writes one record. `component` names the module ("watch", "webhook"),
 * `msg` is a constant sentence; then key, value pairs of strings ending with
 * NULL. A NULL value is written as null (JSON) or "-" (text). Values are
 * escaped for JSON and quoted in text when they contain spaces or quotes;
 * a key marked LOG_NUM has its value written as a JSON number (above). */
void log_write(log_level lvl, const char *component, const char *msg, ...) __attribute__((sentinel));

#endif
