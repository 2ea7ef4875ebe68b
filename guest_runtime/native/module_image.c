/* module_image.c: the extent of a module image at a bare address (module_image.h), as
 * guest_runtime/module_image.py measures it, bounded by the memory readable there. */
#define _POSIX_C_SOURCE 200809L
#include "module_image.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_IMAGE ((uint64_t)2 << 30)   /* a larger claim is a corrupt header, not a module */
#define MAX_PTX ((uint64_t)512 << 20)   /* PTX scanning stops here without a NUL */
#define MAX_ELF_ENTRIES ((uint64_t)1 << 20)
#define FATBIN_MAGIC 0xBA55ED50u
#define WRAPPER_MAGIC 0x466243B1u
#define FATBIN_HEADER 16
#define PN_XNUM 0xFFFF
#define SHT_NULL 0
#define SHT_NOBITS 8

/* The bytes from `base` on that may be read: `bound` of them (from /proc/self/maps when `known`, else MAX_IMAGE
 * with PTX scanned byte by byte, so never a page past its NUL). */
struct reader {
    const uint8_t *base;
    uint64_t bound;
    int known;
    char *why;
    size_t whylen;
};

/* 0, the error value of every measure below, with the reason written. */
static uint64_t fail(struct reader *r, const char *format, ...) {
    if (r->why && r->whylen) {
        va_list args;
        va_start(args, format);
        vsnprintf(r->why, r->whylen, format, args);
        va_end(args);
    }
    return 0;
}

static int fits(const struct reader *r, uint64_t offset, uint64_t count) {
    return offset <= r->bound && count <= r->bound - offset;
}

static uint64_t page_size(void) {
    long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? (uint64_t)size : 4096;
}

/* Bytes readable from `address` on through contiguous readable mappings: 1 with *extent set, 0 when the address
 * lies in no readable mapping, -1 when /proc/self/maps cannot be read. */
static int readable_extent(uintptr_t address, uint64_t *extent) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return -1;
    char line[256];
    unsigned long long end = 0;
    int found = 0, line_start = 1;
    while (fgets(line, sizeof line, maps)) {
        int starts = line_start;
        line_start = strchr(line, '\n') != NULL;
        if (!starts) continue; /* the rest of a long line (its path) */
        char *at;
        unsigned long long start = strtoull(line, &at, 16);
        if (*at != '-') continue;
        unsigned long long stop = strtoull(at + 1, &at, 16);
        if (*at != ' ') continue;
        int readable = at[1] == 'r';
        if (!found) {
            if (start > address) break;
            if (address < stop) {
                if (!readable) break;
                end = stop;
                found = 1;
            }
        } else if (start == end && readable) {
            end = stop;
        } else {
            break;
        }
    }
    fclose(maps);
    if (!found) return 0;
    *extent = end - address;
    return 1;
}

static int open_reader(struct reader *r, const void *address, char *why, size_t whylen) {
    r->base = address;
    r->why = why;
    r->whylen = whylen;
    r->known = 0;
    r->bound = MAX_IMAGE;
    if (!address) return fail(r, "the image address is NULL"), -1;
    int found = readable_extent((uintptr_t)address, &r->bound);
    if (found == 0) return fail(r, "address %p is not in readable memory", address), -1;
    r->known = found == 1;
    if (!r->known) r->bound = MAX_IMAGE;
    return 0;
}

/* Up to 4 leading bytes, stopping at a NUL (a short PTX string at the end of readable memory must not fault). */
static size_t leading(const struct reader *r, uint8_t magic[4]) {
    size_t n = 0;
    while (n < 4 && fits(r, n, 1)) {
        magic[n] = r->base[n];
        if (!magic[n++]) break;
    }
    return n;
}

static int kind_of(const uint8_t *magic, size_t n) {
    if (n < 4) return ORION_IMAGE_PTX;
    if (memcmp(magic, "\177ELF", 4) == 0) return ORION_IMAGE_CUBIN;
    uint32_t word = (uint32_t)magic[0] | (uint32_t)magic[1] << 8 | (uint32_t)magic[2] << 16 | (uint32_t)magic[3] << 24;
    if (word == FATBIN_MAGIC) return ORION_IMAGE_FATBIN;
    if (word == WRAPPER_MAGIC) return ORION_IMAGE_FATBIN_WRAPPER;
    return ORION_IMAGE_PTX;
}

static uint64_t word_at(const uint8_t *p, int width, int big) {
    uint64_t value = 0;
    for (int i = 0; i < width; i++) value |= (uint64_t)p[big ? width - 1 - i : i] << (8 * i);
    return value;
}

static uint64_t fatbin_length(struct reader *r) {
    if (!fits(r, 0, FATBIN_HEADER)) return fail(r, "the fatbin is truncated: its header runs past readable memory");
    const uint8_t *p = r->base;
    uint64_t magic = word_at(p, 4, 0), header = word_at(p + 6, 2, 0), body = word_at(p + 8, 8, 0);
    if (magic != FATBIN_MAGIC) return fail(r, "not a fatbin: magic %#llx", (unsigned long long)magic);
    if (header < FATBIN_HEADER || header > page_size())
        return fail(r, "fatbin header size %llu is absurd", (unsigned long long)header);
    if (body == 0 || body > MAX_IMAGE - header)
        return fail(r, "fatbin claims %llu bytes of entries", (unsigned long long)body);
    if (!fits(r, 0, header + body))
        return fail(r, "the fatbin is truncated: it claims %llu bytes, past readable memory",
                    (unsigned long long)(header + body));
    return header + body;
}

/* offset + size as the end of an ELF part, or 0 past MAX_IMAGE. */
static uint64_t part_end(struct reader *r, uint64_t offset, uint64_t size, const char *what) {
    if (offset > MAX_IMAGE || size > MAX_IMAGE - offset)
        return fail(r, "ELF %s ends past %llu bytes", what, (unsigned long long)MAX_IMAGE);
    return offset + size;
}

/* ELF header, section and segment field offsets, for the 32-bit and the 64-bit class. */
struct elf_shape {
    int word;                                                  /* 4 or 8 */
    uint64_t header, phoff, shoff, ehsize;                     /* header size past e_ident; field offsets */
    uint64_t section, sh_type, sh_offset, sh_size, sh_info;   /* section header size, its fields */
    uint64_t segment, p_offset, p_filesz;                      /* program header size, its fields */
};
static const struct elf_shape ELF32 = { 4, 36, 28, 32, 40, 40, 4, 16, 20, 28, 32, 4, 16 };
static const struct elf_shape ELF64 = { 8, 48, 32, 40, 52, 64, 4, 24, 32, 44, 56, 8, 32 };

static uint64_t elf_length(struct reader *r) {
    if (!fits(r, 0, 16)) return fail(r, "the ELF image is truncated");
    const uint8_t *p = r->base;
    if ((p[4] != 1 && p[4] != 2) || (p[5] != 1 && p[5] != 2))
        return fail(r, "ELF class %u / data encoding %u unknown", p[4], p[5]);
    const struct elf_shape *s = p[4] == 2 ? &ELF64 : &ELF32;
    int big = p[5] == 2, w = s->word;
    if (!fits(r, 16, s->header)) return fail(r, "the ELF header is truncated");
    uint64_t phoff = word_at(p + s->phoff, w, big), shoff = word_at(p + s->shoff, w, big);
    uint64_t ehsize = word_at(p + s->ehsize, 2, big), phentsize = word_at(p + s->ehsize + 2, 2, big);
    uint64_t phnum = word_at(p + s->ehsize + 4, 2, big), shentsize = word_at(p + s->ehsize + 6, 2, big);
    uint64_t shnum = word_at(p + s->ehsize + 8, 2, big), page = page_size();
    if (ehsize < 16 + s->header || ehsize > page)
        return fail(r, "ELF header size %llu is absurd", (unsigned long long)ehsize);
    uint64_t end = ehsize, table_end;
    if (shoff) {
        if (shentsize < s->section || shentsize > page)
            return fail(r, "ELF section header size %llu is absurd", (unsigned long long)shentsize);
        if (!part_end(r, shoff, shentsize, "section header table")) return 0;
        if (!fits(r, shoff, s->section)) return fail(r, "the ELF section header table runs past readable memory");
        const uint8_t *first = p + shoff;
        if (shnum == 0) shnum = word_at(first + s->sh_size, w, big); /* extended numbering */
        if (phnum == PN_XNUM) phnum = word_at(first + s->sh_info, 4, big);
    }
    if (shnum > MAX_ELF_ENTRIES || phnum > MAX_ELF_ENTRIES)
        return fail(r, "ELF claims %llu sections and %llu segments", (unsigned long long)shnum,
                    (unsigned long long)phnum);
    if (phnum) {
        if (phentsize < s->segment || phentsize > page)
            return fail(r, "ELF program header size %llu is absurd", (unsigned long long)phentsize);
        if (!(table_end = part_end(r, phoff, phnum * phentsize, "program header table"))) return 0;
        if (!fits(r, phoff, phnum * phentsize)) return fail(r, "the ELF program headers run past readable memory");
        end = table_end > end ? table_end : end;
        for (uint64_t i = 0; i < phnum; i++) {
            const uint8_t *segment = p + phoff + i * phentsize;
            uint64_t filesz = word_at(segment + s->p_filesz, w, big), segment_end;
            if (!filesz) continue;
            if (!(segment_end = part_end(r, word_at(segment + s->p_offset, w, big), filesz, "segment"))) return 0;
            end = segment_end > end ? segment_end : end;
        }
    }
    if (shoff && shnum) {
        if (!(table_end = part_end(r, shoff, shnum * shentsize, "section header table"))) return 0;
        if (!fits(r, shoff, shnum * shentsize)) return fail(r, "the ELF section headers run past readable memory");
        end = table_end > end ? table_end : end;
        for (uint64_t i = 0; i < shnum; i++) {
            const uint8_t *section = p + shoff + i * shentsize;
            uint64_t type = word_at(section + s->sh_type, 4, big), size = word_at(section + s->sh_size, w, big);
            uint64_t section_end;
            if (type == SHT_NULL || type == SHT_NOBITS || !size) continue;
            if (!(section_end = part_end(r, word_at(section + s->sh_offset, w, big), size, "section"))) return 0;
            end = section_end > end ? section_end : end;
        }
    }
    if (!fits(r, 0, end))
        return fail(r, "the ELF image is truncated: it extends to byte %llu, past readable memory",
                    (unsigned long long)end);
    return end;
}

/* Bytes that never occur in PTX text. */
static int not_text(uint8_t c) {
    return (c >= 1 && c <= 8) || (c >= 14 && c <= 31) || c == 127;
}

/* Scanned byte by byte, so that memory past the NUL is never touched, known extent or not. */
static uint64_t ptx_length(struct reader *r) {
    uint64_t limit = r->bound < MAX_PTX ? r->bound : MAX_PTX;
    static const char directive[] = ".version";
    size_t matched = 0;
    int seen_version = 0;
    for (uint64_t i = 0; i < limit; i++) {
        uint8_t c = r->base[i];
        if (c == 0) {
            if (!seen_version) return fail(r, "not PTX: text without a .version directive");
            return i + 1;
        }
        if (not_text(c)) return fail(r, "not PTX: a binary byte (%#x) at offset %llu", c, (unsigned long long)i);
        if (!seen_version) {
            matched = c == (uint8_t)directive[matched] ? matched + 1 : (c == '.' ? 1 : 0);
            seen_version = matched == sizeof directive - 1;
        }
    }
    return fail(r, "PTX text has no NUL within its first %llu readable bytes", (unsigned long long)limit);
}

static uint64_t measure(struct reader *r, int kind) {
    switch (kind) {
    case ORION_IMAGE_CUBIN: return elf_length(r);
    case ORION_IMAGE_FATBIN: return fatbin_length(r);
    case ORION_IMAGE_PTX: return ptx_length(r);
    default: return fail(r, "a fatbin wrapper points at its image");
    }
}

size_t orion_image_size(const void *image) {
    struct reader r;
    uint8_t magic[4];
    if (open_reader(&r, image, NULL, 0)) return 0;
    return (size_t)measure(&r, kind_of(magic, leading(&r, magic)));
}

int orion_image_locate(const void *image, struct orion_image_span *span, char *why, size_t whylen) {
    struct reader r;
    uint8_t magic[4];
    if (!span) return -1;
    if (open_reader(&r, image, why, whylen)) return -1;
    int kind = kind_of(magic, leading(&r, magic));
    span->kind = kind;
    if (kind != ORION_IMAGE_FATBIN_WRAPPER) {
        span->start = image;
        span->size = (size_t)measure(&r, kind);
        return span->size ? 0 : -1;
    }
    /* __fatBinC_Wrapper_t: int magic, int version, const void *data, ... */
    if (!fits(&r, 0, 8 + sizeof(void *))) return fail(&r, "the fatbin wrapper at %p is truncated", image), -1;
    uint32_t version;
    const void *data;
    memcpy(&version, r.base + 4, 4);
    memcpy(&data, r.base + 8, sizeof data);
    if ((version != 1 && version != 2) || !data)
        return fail(&r, "fatbin wrapper at %p: version %u, data %p", image, version, data), -1;
    struct reader inner;
    if (open_reader(&inner, data, why, whylen)) return -1;
    if (kind_of(magic, leading(&inner, magic)) != ORION_IMAGE_FATBIN)
        return fail(&inner, "the fatbin wrapper at %p points at no fatbin (%p)", image, data), -1;
    span->start = data;
    span->size = (size_t)fatbin_length(&inner);
    return span->size ? 0 : -1;
}
