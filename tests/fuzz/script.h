/* The scripted transport of fuzz_sync.c and the format its seeds are written in (fuzz_seeds.c): the input is a
 * sequence of answers, one per request, each [sel u8][len u16 LE][len bytes of body]. sel & 7 picks the HTTP
 * status (SCRIPT_STATUS), sel >> 3 the chunk size the body is delivered in (0: one chunk, else 7 (sel >> 3)).
 * When the answers run out, every request gets no response (DPREC_ERR_NETWORK). */
#ifndef DPREC_FUZZ_SCRIPT_H
#define DPREC_FUZZ_SCRIPT_H

static const int SCRIPT_STATUS[8] = {200, 201, 404, 409, 500, 401, 400, 429};

static inline unsigned char script_sel(int status) {
    for (unsigned char i = 0; i < 8; i++)
        if (SCRIPT_STATUS[i] == status) return i;
    return 4; /* anything else: as a 500 */
}

#endif
