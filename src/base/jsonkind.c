/*
 * jsonkind.c - the name of a JSON value's type as error messages say it
 * ("expected a string, got an array"): one wording for every module that
 * reads JSON (the OpenAI request parser, the registry file, the gateway).
 */
#include <cjson/cJSON.h>

#include "base/base.h"

const char *sb__json_kind(const struct cJSON *v) {
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}
