#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "suggest.h"

#define SUGGEST_MAX 64

static int sg_fold(char ch)
{
    return ch == '-' ? '_' : tolower((unsigned char)ch);
}

size_t suggest_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la >= SUGGEST_MAX || lb >= SUGGEST_MAX)
        return SIZE_MAX;
    /* Three rows of the dynamic programme: the one before the previous serves the swaps. */
    size_t rows[3][SUGGEST_MAX + 1];
    size_t *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            int same = sg_fold(a[i - 1]) == sg_fold(b[j - 1]);
            size_t best = prev[j - 1] + (same ? 0 : 1);
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && sg_fold(a[i - 1]) == sg_fold(b[j - 2]) &&
                sg_fold(a[i - 2]) == sg_fold(b[j - 1]) && pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

const char *suggest_closest(const char *word, const char *const *candidates, size_t n)
{
    if (word == NULL || word[0] == '\0')
        return NULL;
    size_t len = strlen(word);
    size_t limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (candidates[i] == NULL)
            continue;
        if (strcmp(word, candidates[i]) == 0)
            return NULL;
        size_t d = suggest_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    return best_d <= limit ? best : NULL;
}

const char *suggest_hint(const char *word, const char *const *candidates, size_t n, char *buf,
                         size_t cap)
{
    if (buf == NULL || cap == 0)
        return "";
    const char *s = suggest_closest(word, candidates, n);
    if (s != NULL)
        snprintf(buf, cap, "; did you mean '%s'?", s);
    else
        buf[0] = '\0';
    return buf;
}
