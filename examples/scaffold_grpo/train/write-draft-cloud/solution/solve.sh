#!/bin/bash
echo cloud > /workspace/draft.txt
