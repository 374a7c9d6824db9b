/*
 * The checks of the C test programs (api_test.c, edges_test.c): CHECK(cond, what) and
 * EXPECT(call, status, text) count checks and print one line per failure; next_value gives
 * deterministic pseudo-random floats. A program sets my_rank once it knows it and ends with
 * its summary line "...: N checks, F failed".
 */
#ifndef DISTSPMM_TEST_CHECK_H
#define DISTSPMM_TEST_CHECK_H

#include <distspmm.h>

#include <stdio.h>
#include <string.h>

static unsigned my_rank = 0;
static int checks = 0;
static int failures = 0;

#define CHECK(cond, what)                                                              \
  do {                                                                                 \
    checks++;                                                                          \
    if (!(cond)) {                                                                     \
      failures++;                                                                      \
      fprintf(stderr, "rank %u: %s:%d: %s: CHECK(%s) failed\n", my_rank, __FILE__,     \
              __LINE__, (what), #cond);                                                \
    }                                                                                  \
  } while (0)

/* Runs `call`, expects `want`, and (for failures) a last-error message containing `text`. */
#define EXPECT(call, want, text) expect_status((call), (want), (text), #call, __LINE__)

static void expect_status(dsp_status got, dsp_status want, const char *text, const char *call,
                          int line) {
  checks++;
  if (got != want) {
    failures++;
    fprintf(stderr, "rank %u: line %d: %s returned %d (%s), expected %d (%s); last error: %s\n",
            my_rank, line, call, (int)got, dsp_status_str(got), (int)want, dsp_status_str(want),
            dsp_last_error());
    return;
  }
  if (text != NULL && strstr(dsp_last_error(), text) == NULL) {
    failures++;
    fprintf(stderr, "rank %u: line %d: %s: last error \"%s\" does not contain \"%s\"\n", my_rank,
            line, call, dsp_last_error(), text);
  }
}

/* A deterministic pseudo-random float in [-1, 1). */
static float next_value(unsigned long *state) {
  *state = *state * 6364136223846793005UL + 1442695040888963407UL;
  return (float)((double)(*state >> 40) / (double)(1UL << 24) * 2.0 - 1.0);
}

#endif
